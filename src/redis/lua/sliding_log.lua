-- Sliding log; ARGV 5..7: `limit`, the window (time units), `1` for strict. `KEYS[1]` is a
-- sorted set of `"<t>:<cost>"` entries scored by `t`, `KEYS[2]` their total, so an allowed
-- request reads only the newest and the expired entries; a denial reads the log to find
-- when enough of it expires. Both keys share the hash tag, so one slot in a cluster.
local limit = tonumber(ARGV[5])
local w = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local nkey = KEYS[2]
local function entry(m)
  local t, c = string.match(m, '^(%S+):(%S+)$')
  return tonumber(t), tonumber(c)
end
local last = redis.call('ZRANGE', key, -1, -1)[1]
local lt, lc
if last then lt, lc = entry(last) end
-- A clock read behind the newest entry counts as at it.
local t_now = now
if lt and lt > t_now then t_now = lt end
-- The two keys' expiries are set by separate commands, each from its own clock read (Redis
-- 7.0 does so), so the total may outlive its log by a millisecond: without a log it is stale.
local stored = last and redis.call('GET', nkey)
local total = 0
if stored then total = tonumber(stored) elseif last then
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local _, c = entry(m)
    total = total + c
  end
end
-- Expired: t + w ≤ now.
local cut = t_now - w
local old = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(cut))
for _, m in ipairs(old) do
  local _, c = entry(m)
  total = total - c
end
if lt and lt <= cut then lt = nil end
local function save(t, c)
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cut)) end
  if lt == t then redis.call('ZREM', key, last) end
  redis.call('ZADD', key, fmt(t), fmt(t) .. ':' .. fmt(c))
  local ttl = ttl_ms(t + w)
  redis.call('PEXPIRE', key, ttl)
  redis.call('SET', nkey, fmt(total), 'PX', ttl)
end
-- Settle (src/algo/sliding_log.rs): a refund out of the first entry at or after the take
-- while the take is within the window; an overrun logged now (merged into an entry at now).
if SETTLE then
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cut)) end
  if ACTUAL < CHARGED then
    if TAKEN > cut then
      local m = redis.call('ZRANGEBYSCORE', key, fmt(TAKEN), '+inf', 'LIMIT', 0, 1)[1]
      if m then
        local t, c = entry(m)
        local back = math.min(CHARGED - ACTUAL, c)
        redis.call('ZREM', key, m)
        if c > back then redis.call('ZADD', key, fmt(t), fmt(t) .. ':' .. fmt(c - back)) end
        total = total - back
      end
    end
  else
    local add = ACTUAL - CHARGED
    if lt == t_now then
      redis.call('ZREM', key, last)
      add = lc + add
    end
    redis.call('ZADD', key, fmt(t_now), fmt(t_now) .. ':' .. fmt(add))
    total = total + (ACTUAL - CHARGED)
  end
  local newest = redis.call('ZRANGE', key, -1, -1)[1]
  if newest then
    local ttl = ttl_ms(entry(newest) + w)
    redis.call('PEXPIRE', key, ttl)
    redis.call('SET', nkey, fmt(total), 'PX', ttl)
  else
    redis.call('DEL', key, nkey)
  end
  return
end
if total + cost <= limit then
  total = total + cost
  if write then
    if lt == t_now then save(t_now, lc + cost) else save(t_now, cost) end
  end
  return reply(true, 0, limit - total, w, nil)
end
local remaining = 0
if not strict then remaining = math.max(limit - total, 0) end
local entries = {}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cut), '+inf')) do
  local t, c = entry(m)
  entries[#entries + 1] = {t, c}
end
if strict then
  -- A strict denial is counted: merged into the newest entry, moved to now.
  total = total + cost
  if #entries == 0 then
    entries[1] = {t_now, cost}
    if write then save(t_now, cost) end
  else
    local e = entries[#entries]
    e[1], e[2] = t_now, e[2] + cost
    if write then
      if #old > 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cut)) end
      redis.call('ZREM', key, last)
      old = {}
      lt = nil
      save(t_now, e[2])
    end
  end
elseif write and #old > 0 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cut))
  redis.call('SET', nkey, fmt(total), 'KEEPTTL')
end
local excess = total + cost - limit
local dropped = 0
local at = entries[#entries][1] + w
for _, e in ipairs(entries) do
  dropped = dropped + e[2]
  if dropped >= excess then
    at = e[1] + w
    break
  end
end
return reply(false, math.max(at - t_now, 1), remaining, math.max(entries[#entries][1] + w - t_now, 0), nil)
