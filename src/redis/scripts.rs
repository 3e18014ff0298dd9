//! The Lua scripts (Redis runs Lua 5.1: every number is an `f64`).
//!
//! Each script is the shared [`PRELUDE`] followed by one function per algorithm: a body below
//! (a line-by-line port of its Rust step) inside [`LEAF_HEAD`], or an [`ALL_OF`] of two such
//! functions; the script returns the outermost's reply. ARGV layout, common to all:
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

/// Shared by every script: the time, the reply, `honest_wait`, the expiry; then come the
/// algorithm's functions ([`LEAF_HEAD`], [`ALL_OF`]) and the call of the outermost.
pub(super) const PRELUDE: &str = r#"
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local ups = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local WRITE = ARGV[4] == '1'
-- 2^53: the largest time an f64 still counts in whole units; waits saturate there.
local MAXW = 9007199254740992

local function fmt(x)
  if x == nil then return '' end
  return string.format('%.17g', x)
end

local function reply(allowed, retry, remaining, reset, rate)
  return {allowed and 1 or 0, fmt(retry), fmt(remaining), fmt(reset), fmt(rate)}
end

-- Whether a reply allows: a leaf's first field, or both of an AllOf's pair.
local function allowed(r)
  if type(r[1]) == 'table' then return allowed(r[1]) and allowed(r[2]) end
  return r[1] == 1
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

-- The expiry for a state that is equivalent to a fresh key from idle_at on: ms, rounded up,
-- at least 1, so the expiry loses nothing. On an explicit timeline at least EXPLICIT_TTL_MS
-- of real time: a replay slower than real time must not lose a state early, and a later
-- expiry changes no decision (an idle state decides as a fresh one).
local EXPLICIT = ARGV[1] ~= ''
local function ttl_ms(idle_at)
  local ms = math.ceil((idle_at - now) / (ups / 1000))
  if not (ms >= 1) then ms = 1 end
  if EXPLICIT and ms < EXPLICIT_TTL_MS then ms = EXPLICIT_TTL_MS end
  if ms > 1e15 then ms = 1e15 end
  return string.format('%.0f', ms)
end

-- floor(x / d) for x, d > 0, exact for integers below 2^53: the double quotient may round
-- to the next integer either way.
local function fdiv(x, d)
  local r = math.floor(x / d)
  if r * d > x then r = r - 1 elseif (r + 1) * d <= x then r = r + 1 end
  return r
end

-- "<a> <b> ..." to numbers.
local function fields(v)
  local out = {}
  for f in string.gmatch(v, '%S+') do out[#out + 1] = tonumber(f) end
  return out
end
"#;

/// Opens the function around one algorithm's body: `key` is its first key, `KEYS` and
/// `ARGV` its own (parameters from `ARGV[5]`), `write` whether to store. `NAME` is replaced.
/// The body ends with `return reply(...)`; `end` closes it.
pub(super) const LEAF_HEAD: &str = r#"
local function NAME(KEYS, ARGV, write)
local key = KEYS[1]
local function store(val, idle_at)
  redis.call('SET', key, val, 'PX', ttl_ms(idle_at))
end
"#;

/// Two quotas on one key, all-or-nothing (`AllOf`): `NAME`, `FIRST`, `SECOND`, `K1` (the
/// first's key count), `N1`/`N2` (the parameter counts) are replaced. Both decide on the
/// current state without storing; then, when storing, both store if both allowed, else each
/// that denied stores what its own policy makes of the denial (deciding again on the same
/// state and time gives the same decision). The reply is the pair of replies.
pub(super) const ALL_OF: &str = r#"
local function NAME(KEYS, ARGV, write)
  local k1, a1, k2, a2 = {}, {}, {}, {}
  for i = 1, #KEYS do
    if i <= K1 then k1[i] = KEYS[i] else k2[i - K1] = KEYS[i] end
  end
  for i = 1, N1 do a1[4 + i] = ARGV[4 + i] end
  for i = 1, N2 do a2[4 + i] = ARGV[4 + N1 + i] end
  local r1 = FIRST(k1, a1, false)
  local r2 = SECOND(k2, a2, false)
  if write then
    local ok1, ok2 = allowed(r1), allowed(r2)
    if not ok1 or ok2 then FIRST(k1, a1, true) end
    if not ok2 or ok1 then SECOND(k2, a2, true) end
  end
  return {r1, r2}
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

/// Fixed window; ARGV 5..7: `limit`, the window (time units), `1` for strict. The state is
/// `"<window index> <count>"`.
pub(super) const FIXED_WINDOW: &str = r#"
local limit = tonumber(ARGV[5])
local w = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local v = redis.call('GET', key)
local stored, count = 0, 0
if v then
  local f = fields(v)
  stored, count = f[1], f[2]
end
-- A clock read behind the stored window counts as in it.
local index = math.max(fdiv(now, w), stored)
if index ~= stored then count = 0 end
local ends = (index + 1) * w
local reset = ends - now
local new = count + cost
if new <= limit then
  if write then store(fmt(index) .. ' ' .. fmt(new), ends) end
  return reply(true, 0, limit - new, reset, nil)
end
-- A strict count saturates at limit + 1: any count above the limit denies alike.
if strict and write then store(fmt(index) .. ' ' .. fmt(math.min(new, limit + 1)), ends) end
local remaining = 0
if not strict then remaining = math.max(limit - count, 0) end
return reply(false, math.max(reset, 1), remaining, reset, nil)
"#;

/// Sliding window counter; ARGV 5..8: `limit`, the window (whole time units), `1` for
/// strict, `1` for floor rounding. The state is `"<window index> <previous> <current>"`.
///
/// The weighted count `prev·(w − elapsed) + cur·w` exceeds 2^53 for large windows, so its
/// products are compared exactly in base-2^18 limbs rather than as doubles.
pub(super) const SLIDING_WINDOW: &str = r#"
local limit = tonumber(ARGV[5])
local w = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local floor_mode = ARGV[8] == '1'
local COUNT_MAX = 4294967294
local B = 262144
-- a·b as six base-2^18 limbs, least significant first; exact for integers below 2^54.
local function mul(a, b)
  local a0 = a % B; local a1 = ((a - a0) / B) % B; local a2 = (a - a0 - a1 * B) / (B * B)
  local b0 = b % B; local b1 = ((b - b0) / B) % B; local b2 = (b - b0 - b1 * B) / (B * B)
  local r = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1,
             a2 * b2, 0}
  for i = 1, 5 do
    local c = math.floor(r[i] / B)
    r[i] = r[i] - c * B
    r[i + 1] = r[i + 1] + c
  end
  return r
end
-- The sign of a·b − c·d.
local function cmp(a, b, c, d)
  local x, y = mul(a, b), mul(c, d)
  for i = 6, 1, -1 do
    if x[i] ~= y[i] then
      if x[i] < y[i] then return -1 end
      return 1
    end
  end
  return 0
end
-- floor(a·b / d), exact: a double estimate, then corrected by exact comparisons.
local function muldiv(a, b, d)
  local q = math.max(math.floor(a * b / d), 0)
  while q > 0 and cmp(q, d, a, b) > 0 do q = q - 1 end
  while cmp(q + 1, d, a, b) <= 0 do q = q + 1 end
  return q
end
-- The state (index, prev, cur) seen at time t: (index, prev, cur, elapsed).
local function view(st, p, c, t)
  local ni = fdiv(t, w)
  local idx = math.max(ni, st)
  local e = 0
  if ni >= idx then e = t - idx * w end
  local d = idx - st
  if d == 1 then p, c = c, 0 elseif d > 1 then p, c = 0, 0 end
  return idx, p, c, e
end
-- prev·(w − e) + c·w ≤ bound, with bound = limit·w (exact) or (limit + 1)·w − 1 (floor).
local function fits(p, c, e)
  local m = limit - c
  if floor_mode then m = m + 1 end
  if m < 0 then return false end
  local s = cmp(p, w - e, m, w)
  if floor_mode then return s < 0 end
  return s <= 0
end
-- floor((bound − prev·(w − e)) / w): the units that fit now on top of the carried weight.
local function room(p, e)
  if floor_mode then
    -- floor((p·e − 1) / w): one less than floor(p·e / w) when w divides p·e.
    local q = -1
    if p > 0 and e > 0 then
      q = muldiv(p, e, w)
      if cmp(q, w, p, e) == 0 then q = q - 1 end
    end
    return limit + 1 - p + q
  end
  return limit - p + muldiv(p, e, w)
end
local function idle(idx, p, c)
  if c > 0 then return (idx + 2) * w end
  if p > 0 then return (idx + 1) * w end
  return 0
end
local function retry_after(st, p0, c0)
  local _, p, c, e = view(st, p0, c0, now)
  local b = limit * w
  if floor_mode then b = (limit + 1) * w - 1 end
  local need_cur = (c + cost) * w
  local guess
  if p > 0 and b >= need_cur then
    guess = (w - (b - need_cur) / p) - e
  else
    local ee = 0
    if c > 0 then ee = math.max(w - (b - cost * w) / c, 0) end
    guess = (w - e) + ee
  end
  return honest_wait(guess, function(x)
    local _, p2, c2, e2 = view(st, p0, c0, now + x)
    return fits(p2, c2 + cost, e2)
  end)
end
local stored, prev, cur = 0, 0, 0
local v = redis.call('GET', key)
if v then
  local f = fields(v)
  stored, prev, cur = f[1], f[2], f[3]
end
local index, p, c, e = view(stored, prev, cur, now)
if fits(p, c + cost, e) then
  local ia = idle(index, p, c + cost)
  if write then store(fmt(index) .. ' ' .. fmt(p) .. ' ' .. fmt(c + cost), ia) end
  return reply(true, 0, math.min(room(p, e) - (c + cost), limit), ia - now, nil)
end
local remaining = 0
if not strict then
  remaining = math.min(math.max(math.max(room(p, e), 0) - c, 0), limit)
end
if strict then
  -- Every denied unit counts (32-bit saturation), so a hammering client stays out.
  stored, prev, cur = index, p, math.min(c + cost, COUNT_MAX)
  if write then store(fmt(stored) .. ' ' .. fmt(prev) .. ' ' .. fmt(cur), idle(stored, prev, cur)) end
end
local wait = retry_after(stored, prev, cur)
return reply(false, wait, remaining, math.max(idle(stored, prev, cur) - now, 0), nil)
"#;

/// Sub-window counters; ARGV 5..8: `limit`, the bucket (time units), the span in buckets,
/// `1` for strict. The state is one hash: a field per bucket index holding its count, and
/// `h`, the newest bucket seen. Fields that left the span are deleted on the next write, and
/// the key expires when its newest count leaves the span.
pub(super) const SUB_WINDOW: &str = r#"
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
"#;

/// Sliding log; ARGV 5..7: `limit`, the window (time units), `1` for strict. `KEYS[1]` is a
/// sorted set of `"<t>:<cost>"` entries scored by `t`, `KEYS[2]` their total, so an allowed
/// request reads only the newest and the expired entries; a denial reads the log to find
/// when enough of it expires. Both keys share the hash tag, so one slot in a cluster.
pub(super) const SLIDING_LOG: &str = r#"
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
local stored = redis.call('GET', nkey)
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
"#;
