//! The hybrid limiter's two Lua scripts. Each reads Redis' `TIME` itself, so every instance's
//! reservations and publishes share the server's timeline.

/// GCRA lease. `KEYS[1]`: the key's TAT, stored as the `RedisLimiter`'s GCRA script stores it
/// (microseconds of Redis time, `%.17g`), so both limiters can share one key. `KEYS[2]`: the
/// back-dated debt's own TAT (below).
///
/// ARGV: `T` and `τ = B·T` (µs); `want`: units to lease; `give`: unspent units handed back;
/// `debt`: units admitted without a lease while Redis answered (a key's first requests),
/// charged now; `back` and `since`: units admitted while Redis was unreachable, and when the
/// first of them was (µs).
///
/// The back-dated debt is counted on a TAT of its own, from `since`: the fallback's
/// admissions of every instance, during the outage, as GCRA would have counted them then.
/// Only where that runs past now does it hold the shared TAT back: a fleet whose fallback
/// shares stayed within the quota owes nothing once Redis is back, one that exceeded it pays
/// the excess back. (Charged on the shared TAT itself, each instance's charge would land
/// after the grants of those that reconnected first, and the fleet would pay the whole
/// outage again.)
///
/// Returns `{granted, wait, now}`: `wait` (µs, `%.17g`) until one more unit could be
/// leased, `now` Redis' time (µs).
pub(super) const LEASE: &str = r#"
local T = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local give = tonumber(ARGV[4])
local debt = tonumber(ARGV[5])
local back = tonumber(ARGV[6])
local since = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('GET', KEYS[1])
local tat = v and tonumber(v) or 0
-- Handed-back units leave the schedule; never below now (units in the past are spent time).
if give > 0 then tat = math.max(tat - give * T, now) end
if back > 0 then
  local b = redis.call('GET', KEYS[2])
  local btat = math.max(b and tonumber(b) or 0, math.min(since, now)) + back * T
  tat = math.max(tat, btat)
  -- Kept a minute past now (or past itself), for the other instances' charges.
  redis.call('SET', KEYS[2], string.format('%.17g', btat), 'PX', 60000 + math.ceil(math.max(btat - now, 0) / 1000))
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
-- The next unit conforms once new_tat + T - now' <= tau.
local wait = math.max(new_tat + T - tau - now, 0)
if new_tat > now then
  redis.call('SET', KEYS[1], string.format('%.17g', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
else
  redis.call('DEL', KEYS[1])
end
return {granted, string.format('%.17g', wait), string.format('%.17g', now)}
"#;

/// Merged states. `KEYS[1]`: a hash of instance id → that instance's published state.
/// ARGV: this instance's id, its state (empty: idle, delete the field), the state's time to
/// idle in ms, then fields to delete (states found idle by the last read).
///
/// Returns `{seconds, microseconds, {field, value, ...}}`: Redis' time and the whole hash.
/// The hash expires when its longest-lived state becomes idle.
pub(super) const PUBLISH: &str = r#"
local t = redis.call('TIME')
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
for i = 4, #ARGV do
  if ARGV[i] ~= ARGV[1] then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 and redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {t[1], t[2], redis.call('HGETALL', KEYS[1])}
"#;
