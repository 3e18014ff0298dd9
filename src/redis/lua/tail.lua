-- Runs the request on the outermost function, `MAIN` (replaced). A settle applies once per
-- reservation: its mark (the last key) is checked first and set once `MAIN` has run (living
-- the ticket's life and a margin for the settlers' clock skew, `MARK_CLOCK_MARGIN`), so a
-- retried settle (a lost reply) finds it and changes nothing, and one whose `MAIN` failed
-- (a script error: Redis keeps what ran before it) leaves no mark, its retry to make. A
-- partial grant finds the most units in 1..cost the state admits now, by bisection on peeks
-- as `Algorithm::update_up_to` does, then counts them (or one unit's denial when none fits).
if SETTLE then
  if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return 0 end
  MAIN(KEYS, ARGV, true)
  redis.call('SET', KEYS[#KEYS], '1', 'PX', MARK_MS + MARK_CLOCK_MARGIN_MS)
  return 1
end
if MODE == 'u' then
  local most = cost
  local granted = 0
  if allowed(MAIN(KEYS, ARGV, false)) then
    granted = most
  else
    cost = 1
    if allowed(MAIN(KEYS, ARGV, false)) then
      local lo, hi = 1, most
      while hi - lo > 1 do
        local mid = lo + math.floor((hi - lo) / 2)
        cost = mid
        if allowed(MAIN(KEYS, ARGV, false)) then lo = mid else hi = mid end
      end
      granted = lo
    end
  end
  cost = math.max(granted, 1)
  return {granted, MAIN(KEYS, ARGV, true)}
end
local r = MAIN(KEYS, ARGV, WRITE)
if MODE == 't' then return {fmt(now), r} end
return r
