-- GCRA; ARGV 5..7: `T`, `B·T` (time units), `1` for strict.
local T = tonumber(ARGV[5])
local tau = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local v = redis.call('GET', key)
local tat = v and tonumber(v) or 0
-- Settle (src/algo/gcra.rs): a refund moves `tat` back, never below now; an overrun moves it
-- on from max(tat, now), past the burst if need be.
if SETTLE then
  if ACTUAL > CHARGED then
    tat = math.max(tat, now) + (ACTUAL - CHARGED) * T
  else
    tat = tat - math.min((CHARGED - ACTUAL) * T, math.max(tat - now, 0))
  end
  if tat > now then store(fmt(tat), tat) else redis.call('DEL', key) end
  return
end
-- floor(x / T), exact: a double quotient may round up to the next integer.
local function per(x) return fdiv(x, T) end
local inc = cost * T
local base = math.max(tat, now)
local new_tat = base + inc
local ahead = new_tat - now
if ahead <= tau then
  if write then store(fmt(new_tat), new_tat) end
  return reply(true, 0, per(tau - ahead), ahead, nil)
end
if strict then
  if write then store(fmt(new_tat), new_tat) end
  return reply(false, (ahead - tau) + inc, 0, ahead, nil)
end
local a = base - now
return reply(false, new_tat - tau - now, per(math.max(tau - a, 0)), a, nil)
