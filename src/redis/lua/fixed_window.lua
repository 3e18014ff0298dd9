-- Fixed window; ARGV 5..7: `limit`, the window (time units), `1` for strict. The state is
-- `"<window index> <count>"`.
local limit = tonumber(ARGV[5])
local w = tonumber(ARGV[6])
local strict = ARGV[7] == '1'
local v = redis.call('GET', key)
local stored, count = 0, 0
if v then
  local f = fields(v)
  stored, count = f[1], f[2]
end
-- Settle (src/algo/fixed_window.rs): a refund out of the window the request was counted in
-- while it is the current one; an overrun counted in the current window, up to limit + 1,
-- never below the count already there (kept under a larger limit: a plan, a live switch).
if SETTLE then
  if ACTUAL < CHARGED then
    if fdiv(TAKEN, w) == stored and fdiv(now, w) <= stored and count > 0 then
      local left = math.max(count - (CHARGED - ACTUAL), 0)
      store(fmt(stored) .. ' ' .. fmt(left), (stored + 1) * w)
    end
  else
    local index = math.max(fdiv(now, w), stored)
    if index ~= stored then count = 0 end
    local new = math.max(count, math.min(count + (ACTUAL - CHARGED), limit + 1))
    store(fmt(index) .. ' ' .. fmt(new), (index + 1) * w)
  end
  return
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
-- A strict count saturates at limit + 1: any count above the limit denies alike; never below
-- the count already there (kept under a larger limit: a plan, a live switch).
if strict and write then
  store(fmt(index) .. ' ' .. fmt(math.max(count, math.min(new, limit + 1))), ends)
end
local remaining = 0
if not strict then remaining = math.max(limit - count, 0) end
return reply(false, math.max(reset, 1), remaining, reset, nil)
