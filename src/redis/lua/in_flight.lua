-- In flight; ARGV 5..6: `max`, the epoch (half the lease, time units). The state is
-- `"<epoch> <prev> <cur>"`: the permits taken in the previous epoch and in this one; a permit
-- counts in its epoch and the next, unless given back before (src/algo/in_flight.rs). The
-- key expires when its last permit does, so a crashed holder's permits come back by
-- themselves.
local max = tonumber(ARGV[5])
local w = tonumber(ARGV[6])
local v = redis.call('GET', key)
local epoch, prev, cur = 0, 0, 0
if v then
  local f = fields(v)
  epoch, prev, cur = f[1], f[2], f[3]
end
-- As of now's epoch: the permits of the epoch before move to `prev`, older ones have expired;
-- an epoch behind the state's (a clock read behind it) counts as the state's.
local e = fdiv(now, w)
if e == epoch + 1 then
  epoch, prev, cur = e, cur, 0
elseif e > epoch + 1 then
  epoch, prev, cur = e, 0, 0
end
local function save()
  if prev + cur == 0 then
    redis.call('DEL', key)
  else
    local last = 1
    if cur > 0 then last = 2 end
    store(fmt(epoch) .. ' ' .. fmt(prev) .. ' ' .. fmt(cur), (epoch + last) * w)
  end
end
-- Settle: `CHARGED - ACTUAL` permits given back from the epoch they were taken in (what it
-- lacks from the other live one), if they have not expired; an `ACTUAL` above the charge
-- holds the difference too (up to `max`). A permit's ticket may live as long as its lease (a
-- release must land when a long request ends): its settle mark, set by the tail, lives as
-- long, so no replay within it settles twice.
if SETTLE then
  local lease_ms = math.ceil(2 * w / (ups / 1000))
  if lease_ms > MARK_MS then MARK_MS = lease_ms end
  if ACTUAL < CHARGED then
    -- What the ticket's epoch lacks comes from the other live one: a permit taken on a
    -- clock behind the state's epoch (a failover's) is counted an epoch after its ticket's.
    local taken, released = fdiv(TAKEN, w), CHARGED - ACTUAL
    if taken == epoch then
      local here = math.min(released, cur)
      cur, prev = cur - here, math.max(prev - (released - here), 0)
    elseif taken == epoch - 1 then
      local here = math.min(released, prev)
      prev, cur = prev - here, math.max(cur - (released - here), 0)
    end
  else
    cur = math.max(cur, math.min(cur + (ACTUAL - CHARGED), max - prev))
  end
  save()
  return
end
local held = prev + cur
if held + cost <= max then
  if write then
    cur = cur + cost
    save()
  end
  return reply(true, 0, max - held - cost, (epoch + 2) * w - now, nil)
end
-- Without a release, `prev` expires when the next epoch begins and `cur` one later.
local retry = (epoch + 2) * w - now
if cur + cost <= max then retry = (epoch + 1) * w - now end
local reset = (epoch + 1) * w - now
if cur > 0 then reset = (epoch + 2) * w - now end
return reply(false, math.max(retry, 1), math.max(max - held, 0), reset, nil)
