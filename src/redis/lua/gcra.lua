-- GCRA; ARGV 5..7: `T`, `B·T` (time units), `1` for strict.
local T = tonumber(ARGV[5])
local tau = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local v = redis.call('GET', key)
local tat = v and tonumber(v) or 0
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
