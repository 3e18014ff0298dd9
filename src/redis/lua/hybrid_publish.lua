-- The hybrid limiter's merged-state round: this instance's state of each key of a batch
-- written in the key's hash (a field per instance), and the whole hashes pushed to every
-- instance.
--
-- ARGV: the publishing command (`PUBLISH`; `SPUBLISH` to a shard channel of the call's node on
-- a cluster), the channel, this instance's id, n; then per key its client key, its hash's key,
-- this instance's state (`<idle at, Unix ms>:<word>`; empty: idle, delete the field) and its
-- time to idle in ms. KEYS: the first hash, for routing: on a cluster a call holds one node's
-- keys, of several slots, which the script reaches with `allow-cross-slot-keys`.
--
-- Fields whose state went idle are deleted; a hash expires when its longest-lived state goes
-- idle. Returns {seconds, microseconds}; publishes the instance, the time and per key its
-- client key, its number of fields and each field's instance and state.
local function ns(s)
  s = tostring(s)
  return #s .. ':' .. s
end
local publish, channel, inst, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local msg = {ns(inst), ns(t[1]), ns(t[2])}
for i = 1, n do
  local a = 4 + (i - 1) * 4
  local key, h, value, ttl = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], tonumber(ARGV[a + 4])
  if value == '' then
    redis.call('HDEL', h, inst)
  else
    redis.call('HSET', h, inst, value)
  end
  local all = redis.call('HGETALL', h)
  local fields, count, last = {}, 0, 0
  for j = 1, #all, 2 do
    local idle = tonumber(string.match(all[j + 1], '^(%d+):'))
    if idle and idle <= now_ms then
      redis.call('HDEL', h, all[j])
    else
      count = count + 1
      fields[#fields + 1] = ns(all[j]) .. ns(all[j + 1])
      -- A state not of this form (another limiter's) keeps the hash a minute.
      last = math.max(last, idle or (now_ms + 60000))
    end
  end
  if count > 0 then
    redis.call('PEXPIRE', h, math.max(last - now_ms, ttl, 1))
  end
  msg[#msg + 1] = ns(key) .. ns(count) .. table.concat(fields)
end
redis.call(publish, channel, table.concat(msg))
return {t[1], t[2]}
