-- Sub-window counters; ARGV 5..8: `limit`, the bucket (time units), the span in buckets,
-- `1` for strict. The state is one hash: a field per bucket index holding its count, and
-- `h`, the newest bucket seen. Fields that left the span are deleted on the next write, and
-- the key expires when its newest count leaves the span.
local limit = tonumber(ARGV[5])
local bw = tonumber(ARGV[6])
local n = tonumber(ARGV[7])
local strict = ARGV[8] == '1'
local COUNT_MAX = 4294967294
local raw = redis.call('HGETALL', key)
local head = 0
local counts = {}
for i = 1, #raw, 2 do
  if raw[i] == 'h' then head = tonumber(raw[i + 1])
  else counts[tonumber(raw[i])] = tonumber(raw[i + 1]) end
end
-- A clock read behind the newest bucket counts as in it.
local bucket = math.max(fdiv(now, bw), head)
local oldest = bucket - (n - 1)
local total = 0
local stale = {}
for b, c in pairs(counts) do
  if b < oldest then stale[#stale + 1] = b else total = total + c end
end
for _, b in ipairs(stale) do counts[b] = nil end
local function idle()
  local newest
  for b, c in pairs(counts) do
    if c > 0 and (newest == nil or b > newest) then newest = b end
  end
  if newest == nil then return 0 end
  return (newest + n) * bw
end
local function save(slot)
  if #stale > 0 then
    local f = {}
    for i, b in ipairs(stale) do f[i] = fmt(b) end
    redis.call('HDEL', key, unpack(f))
  end
  if slot then
    redis.call('HSET', key, fmt(bucket), fmt(counts[bucket]), 'h', fmt(bucket))
    redis.call('PEXPIRE', key, ttl_ms(idle()))
  elseif bucket > head then
    redis.call('HSET', key, 'h', fmt(bucket))
  end
end
-- Settle (src/algo/sub_window.rs): a refund out of the bucket the request was counted in
-- while that bucket is in the span; an overrun counted in the current bucket.
if SETTLE then
  local at = bucket
  if ACTUAL < CHARGED then
    at = fdiv(TAKEN, bw)
    if at > bucket or at < oldest then return end
    counts[at] = math.max((counts[at] or 0) - (CHARGED - ACTUAL), 0)
  else
    counts[at] = math.min((counts[at] or 0) + (ACTUAL - CHARGED), COUNT_MAX)
  end
  if #stale > 0 then
    local f = {}
    for i, b in ipairs(stale) do f[i] = fmt(b) end
    redis.call('HDEL', key, unpack(f))
  end
  redis.call('HSET', key, fmt(at), fmt(counts[at]), 'h', fmt(bucket))
  redis.call('PEXPIRE', key, ttl_ms(idle()))
  return
end
local here = counts[bucket] or 0
if total + cost <= limit then
  counts[bucket] = here + cost
  total = total + cost
  if write then save(true) end
  return reply(true, 0, limit - total, math.max(idle() - now, 0), nil)
end
local remaining = 0
if not strict then remaining = math.max(limit - total, 0) end
if strict then
  -- Every denied unit counts, so a hammering client stays out until its bucket leaves.
  local after = math.min(here + cost, COUNT_MAX)
  total = total + (after - here)
  counts[bucket] = after
end
if write then save(strict) end
-- The first bucket whose leaving the span drops enough: it leaves when bucket b + n starts.
local excess = math.max(total + cost - limit, 0)
local dropped = 0
local at = (bucket + n) * bw
for b = math.max(oldest, 0), bucket do
  dropped = dropped + (counts[b] or 0)
  if dropped >= excess then
    at = (b + n) * bw
    break
  end
end
return reply(false, math.max(at - now, 1), remaining, math.max(idle() - now, 0), nil)
