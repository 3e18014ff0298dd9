-- Exponential; ARGV 5..7: `L`, `P` (time units), `1` for strict. The state is
-- `"<t_prev> <r>"`.
local limit = tonumber(ARGV[5])
local P = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
-- Lua 5.1 has no expm1: Kahan's (u−1)·x/log(u) with u = e^x is accurate to a few ulps, not
-- bit-identical to libm's expm1.
local function expm1(x)
  local u = math.exp(x)
  if u == 1 then return x end
  local um1 = u - 1
  if um1 == -1 then return -1 end
  return um1 * x / math.log(u)
end
local function finite(x) return x > -math.huge and x < math.huge end
local function smoothed(i, c, r)
  local oma = -expm1(-i)
  return oma * c / i + math.exp(-i) * r
end
local function r_now_at(tp, rp, t, c)
  local i = math.max(math.max(t - tp, 0) / P, 1e-10)
  return math.max(smoothed(i, c, rp), c)
end
local function idle_at(t, r)
  return t + math.ceil(math.max(math.log(2 * r), 2) * P)
end
local function retry_after(tp, rp, t, c, rn)
  local i0 = math.max(math.max(t - tp, 0) / P, 1e-10)
  local function g(i) return smoothed(i, c, rp) - limit end
  local exim = i0 + math.log(rn / limit)
  local i = i0
  if finite(exim) and exim > i0 and g(exim) > 0 then i = exim end
  for _ = 1, 64 do
    local e = math.exp(-i)
    local slope = c * (i * e + expm1(-i)) / (i * i) - e * rp
    local nx = i - g(i) / slope
    if not (finite(nx) and nx > i) then break end
    local done = nx - i <= i * 1e-15
    i = nx
    if done then break end
  end
  local guess = i * P - math.max(t - tp, 0)
  return honest_wait(guess, function(w) return r_now_at(tp, rp, t + w, c) <= limit end)
end
local v = redis.call('GET', key)
local t_prev, r_prev = 0, 0
if v then
  local a, b = string.match(v, '^(%S+) (%S+)$')
  t_prev = tonumber(a)
  r_prev = tonumber(b)
end
-- Settle (src/algo/exponential.rs): the difference is an impulse at the take's time, decayed
-- to the state's time and added to r (floored at zero).
if SETTLE then
  local impulse = math.abs(ACTUAL - CHARGED) * math.exp(-(math.max(t_prev - TAKEN, 0) / P))
  local r = r_prev + impulse
  if ACTUAL < CHARGED then r = math.max(r_prev - impulse, 0) end
  store(fmt(t_prev) .. ' ' .. fmt(r), idle_at(t_prev, r))
  return
end
local rn = r_now_at(t_prev, r_prev, now, cost)
local per_sec = rn * ups / P
local t_store = math.max(now, t_prev)
local state = fmt(t_store) .. ' ' .. fmt(rn)
if rn <= limit then
  if write and TAKE then
    -- `Algorithm::take` (src/algo/exponential.rs): a whole impulse of `cost` on the average
    -- decayed to now, so that a settle's refund takes back no more than the take added.
    -- An idle key is a fresh one: what is left of its average is dropped.
    local left = 0
    if t_store < idle_at(t_prev, r_prev) then left = math.exp(-((t_store - t_prev) / P)) * r_prev end
    local rt = math.max(left + cost, rn)
    store(fmt(t_store) .. ' ' .. fmt(rt), idle_at(t_store, rt))
  elseif write then
    store(state, idle_at(t_store, rn))
  end
  return reply(true, 0, nil, nil, per_sec)
end
local wait
if strict then
  wait = retry_after(t_store, rn, now, cost, r_now_at(t_store, rn, now, cost))
  if write then store(state, idle_at(t_store, rn)) end
else
  wait = retry_after(t_prev, r_prev, now, cost, rn)
end
return reply(false, wait, nil, nil, per_sec)
