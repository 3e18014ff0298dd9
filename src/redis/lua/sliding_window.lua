-- Sliding window counter; ARGV 5..8: `limit`, the window (whole time units), `1` for
-- strict, `1` for the lenient bias (floored). The state is `"<window index> <previous> <current>"`.
--
-- The weighted count `prev·(w − elapsed) + cur·w` exceeds 2^53 for large windows, so its
-- products are compared exactly in base-2^18 limbs rather than as doubles.
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
-- Settle (src/algo/sliding_window.rs): a refund out of the count of the window the request
-- was counted in while it is the current or the previous one; an overrun counted now.
if SETTLE then
  if ACTUAL < CHARGED then
    local back = CHARGED - ACTUAL
    local taken = fdiv(TAKEN, w)
    if taken == index then
      c = math.max(c - back, 0)
    elseif taken + 1 == index then
      p = math.max(p - back, 0)
    else
      return
    end
  else
    c = math.min(c + (ACTUAL - CHARGED), COUNT_MAX)
  end
  store(fmt(index) .. ' ' .. fmt(p) .. ' ' .. fmt(c), idle(index, p, c))
  return
end
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
