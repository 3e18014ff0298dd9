-- EARRRL; ARGV 5..9: `λ`, `R`, the retry offset and the idle offset (seconds), `1` for strict.
-- The state is the virtual time `S` in seconds.
local lambda = tonumber(ARGV[5])
local max_rate = tonumber(ARGV[6])
local retry_offset = tonumber(ARGV[7])
local idle_offset = tonumber(ARGV[8])
local strict = ARGV[9] == '1'
-- Lua 5.1 has no log1p: log(u)·x/(u−1) with u = 1 + x is accurate to a few ulps (Goldberg),
-- not bit-identical to libm's log1p.
local function log1p(x)
  local u = 1 + x
  if u == 1 then return x end
  return math.log(u) * x / (u - 1)
end
local function idle_at(s)
  return math.max(math.ceil((s + idle_offset) * ups), 0)
end
local v = redis.call('GET', key)
local s = v and tonumber(v) or -math.huge
if idle_at(s) <= now then s = -math.huge end
local nows = now / ups
local x = lambda * (s - nows)
local ex = math.exp(x)
local rate = lambda * ex
-- Settle (src/algo/earrrl.rs): the difference is an impulse at the take's time, decayed to
-- now and added to N in log space (a refund subtracts it; nothing left is a fresh key).
if SETTLE then
  local z = math.log(math.abs(ACTUAL - CHARGED)) + math.min(lambda * (TAKEN / ups - nows), 0)
  local ln_n = -math.huge
  if ACTUAL > CHARGED then
    local m = math.max(x, z)
    ln_n = m + math.log(math.exp(x - m) + math.exp(z - m))
  elseif z < x then
    ln_n = x + log1p(-math.exp(z - x))
  end
  if ln_n > -math.huge then
    local ns = nows + ln_n / lambda
    store(fmt(ns), idle_at(ns))
  else
    redis.call('DEL', key)
  end
  return
end
local function update()
  local hi, ratio
  if ex > cost then
    hi = x
    ratio = cost / ex
  else
    if cost == 1 then hi = 0 else hi = math.log(cost) end
    ratio = ex / cost
  end
  return nows + (hi + log1p(ratio)) / lambda
end
if rate <= max_rate then
  local ns = update()
  if write then store(fmt(ns), idle_at(ns)) end
  return reply(true, 0, nil, nil, rate)
end
local after = s
if strict then after = update() end
local wait = honest_wait((after - nows + retry_offset) * ups, function(w)
  return lambda * math.exp(lambda * (after - (now + w) / ups)) <= max_rate
end)
if strict and write then store(fmt(after), idle_at(after)) end
return reply(false, wait, nil, nil, rate)
