-- Runs the request on the outermost function, `MAIN` (replaced). A settle applies once per
-- reservation: its mark (the last key) is set first, and a retried settle (a lost reply)
-- finds it and changes nothing. A partial grant finds the most units in 1..cost the state
-- admits now, by bisection on peeks as `Algorithm::update_up_to` does, then counts them (or
-- one unit's denial when none fits).
if SETTLE then
  if not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'PX', SETTLE_MARK_MS) then return 0 end
  MAIN(KEYS, ARGV, true)
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
