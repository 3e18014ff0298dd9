//! The Lua scripts (Redis runs Lua 5.1: every number is an `f64`).
//!
//! Each script is the shared [`PRELUDE`] followed by one algorithm's body, a line-by-line port
//! of its Rust `decide`. ARGV layout, common to all:
//!
//! 1. `now` in time units, or empty: read Redis' `TIME` and work in microseconds;
//! 2. `ups`: time units per second (`1000000` or `1000000000`);
//! 3. `cost`; 4. `1` to store the new state (`check`), `0` to leave it (`peek`);
//!
//! then the algorithm's parameters, already converted to the time unit by the Rust side.
//!
//! The reply is `{allowed (0/1), retry_after, remaining, reset_after, rate}`, the last four as
//! strings (`%.17g`, so doubles cross exactly; empty: not known): Redis would truncate a Lua
//! number reply to an integer.

/// Shared by every script: the time, the reply, `honest_wait` and the store with `PX`.
pub(super) const PRELUDE: &str = r#"
local key = KEYS[1]
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local ups = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local write = ARGV[4] == '1'
-- 2^53: the largest time an f64 still counts in whole units; waits saturate there.
local MAXW = 9007199254740992

local function fmt(x)
  if x == nil then return '' end
  return string.format('%.17g', x)
end

local function reply(allowed, retry, remaining, reset, rate)
  return {allowed and 1 or 0, fmt(retry), fmt(remaining), fmt(reset), fmt(rate)}
end

-- src/algo.rs honest_wait: gallop up to an allowed wait, gallop down to a denied one, bisect.
local function honest_wait(guess, allowed_at)
  local denied = 0
  local allowed = math.ceil(guess)
  if not (allowed >= 1) then allowed = 1 end
  if allowed > MAXW then allowed = MAXW end
  local step = 1
  while not allowed_at(allowed) do
    if allowed >= MAXW then return allowed end
    denied = allowed
    allowed = math.min(allowed + step, MAXW)
    step = step * 2
  end
  step = 1
  while allowed - denied > 1 do
    local probe = allowed - math.min(step, allowed - denied - 1)
    if not allowed_at(probe) then
      denied = probe
      break
    end
    allowed = probe
    step = step * 2
  end
  while allowed - denied > 1 do
    local mid = denied + math.floor((allowed - denied) / 2)
    if allowed_at(mid) then allowed = mid else denied = mid end
  end
  return allowed
end

-- Stores the state with an expiry at idle_at (ms, rounded up, at least 1): from then on the
-- state is equivalent to a fresh key, so the expiry loses nothing.
local function store(val, idle_at)
  local ms = math.ceil((idle_at - now) / (ups / 1000))
  if not (ms >= 1) then ms = 1 end
  if ms > 1e15 then ms = 1e15 end
  redis.call('SET', key, val, 'PX', string.format('%.0f', ms))
end
"#;

/// GCRA; ARGV 5..7: `T`, `B·T` (time units), `1` for strict.
pub(super) const GCRA: &str = r#"
local T = tonumber(ARGV[5])
local tau = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local v = redis.call('GET', key)
local tat = v and tonumber(v) or 0
-- floor(x / T), exact: a double quotient may round up to the next integer.
local function per(x)
  local r = math.floor(x / T)
  if r * T > x then r = r - 1 end
  return r
end
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
"#;

/// EARRRL; ARGV 5..9: `λ`, `R`, the retry offset and the idle offset (seconds), `1` for strict.
/// The state is the virtual time `S` in seconds.
pub(super) const EARRRL: &str = r#"
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
"#;

/// Exponential; ARGV 5..7: `L`, `P` (time units), `1` for strict. The state is
/// `"<t_prev> <r>"`.
pub(super) const EXPONENTIAL: &str = r#"
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
local rn = r_now_at(t_prev, r_prev, now, cost)
local per_sec = rn * ups / P
local t_store = math.max(now, t_prev)
local state = fmt(t_store) .. ' ' .. fmt(rn)
if rn <= limit then
  if write then store(state, idle_at(t_store, rn)) end
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
"#;
