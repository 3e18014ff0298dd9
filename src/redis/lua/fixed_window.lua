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
