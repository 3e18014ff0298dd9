-- The hybrid limiter's GCRA round: leases, hand-backs and charges for a batch of keys, and
-- the keys' new TATs pushed to every instance.
--
-- ARGV: the publishing command (`PUBLISH`; `SPUBLISH` to a shard channel of the call's node on
-- a cluster), the channel, this instance's id, n; then per key its client key, its TAT's key (the
-- RedisLimiter's key and form: µs of Redis time, %.17g), the back-dated debts' own TAT's key,
-- `want` (units to lease), `give` (unspent units handed back), `debt` (units admitted beyond
-- leases, charged now), `back` (1: the debt was run up while Redis was unreachable, charged
-- back-dated from `since`, µs), and its quota's T and tau = B*T (µs). KEYS: the first key's
-- TAT, for routing: on a cluster a call holds one node's keys, of several slots, which the
-- script reaches with `allow-cross-slot-keys`.
--
-- A back-dated debt is counted on a TAT of its own, from `since`: the fallbacks' admissions
-- of every instance during the outage, as GCRA would have counted them then. Only where that
-- runs past now does it hold the shared TAT back: a fleet whose fallback shares stayed
-- within the quota owes nothing once Redis is back.
--
-- Returns {seconds, microseconds, then per key {granted, new TAT}}; publishes the instance,
-- the time and per key its client key and new TAT (0: none).
local function ns(s)
  s = tostring(s)
  return #s .. ':' .. s
end
local publish, channel, inst, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {t[1], t[2]}
local msg = {ns(inst), ns(t[1]), ns(t[2])}
for i = 1, n do
  local a = 4 + (i - 1) * 10
  local key, k, kb = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local want = tonumber(ARGV[a + 4])
  local give = tonumber(ARGV[a + 5])
  local debt = tonumber(ARGV[a + 6])
  local back = ARGV[a + 7] == '1'
  local since = tonumber(ARGV[a + 8])
  local T = tonumber(ARGV[a + 9])
  local tau = tonumber(ARGV[a + 10])
  local v = redis.call('GET', k)
  local tat = v and tonumber(v) or 0
  -- Handed-back units leave the schedule; never below now (units in the past are spent).
  if give > 0 then tat = math.max(tat - give * T, now) end
  if back and debt > 0 then
    local b = redis.call('GET', kb)
    local btat = math.max(b and tonumber(b) or 0, math.min(since, now)) + debt * T
    tat = math.max(tat, btat)
    -- Kept a minute past now (or past itself), for the other instances' charges.
    redis.call('SET', kb, string.format('%.17g', btat), 'PX',
      60000 + math.ceil(math.max(btat - now, 0) / 1000))
    debt = 0
  end
  local base = math.max(tat, now) + debt * T
  -- floor((tau - ahead) / T), exact: a double quotient may round up.
  local room = tau - (base - now)
  local granted = 0
  if want > 0 and room >= T then
    local q = math.floor(room / T)
    while q * T > room do q = q - 1 end
    while (q + 1) * T <= room do q = q + 1 end
    granted = math.min(want, q)
  end
  local new_tat = base + granted * T
  local pushed = '0'
  if new_tat > now then
    pushed = string.format('%.17g', new_tat)
    redis.call('SET', k, pushed, 'PX', math.ceil((new_tat - now) / 1000))
  else
    redis.call('DEL', k)
  end
  out[#out + 1] = {granted, pushed}
  msg[#msg + 1] = ns(key) .. ns(pushed)
end
redis.call(publish, channel, table.concat(msg))
return out
