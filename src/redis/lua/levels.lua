-- A hierarchy of levels in one call (`check_all`), after the algorithm's functions, with
-- `MAIN` (replaced) deciding one level: ARGV[5] is the parameter count of one level, then
-- come each level's parameters; the keys are each level's in turn, `#KEYS / levels` each
-- (no key at two levels: the Rust side refuses that). Every level decides on the state as it
-- is, nothing stored; if all allow, every level stores its charge (deciding again on the
-- same state and time gives the same decision); else only the first level that denied stores
-- what its own policy makes of the denial, and no other level is touched. The reply is every
-- level's decision, in order.
local P = tonumber(ARGV[5])
local n = (#ARGV - 5) / P
local K = #KEYS / n
local function level(i)
  local k, a = {}, {}
  for j = 1, K do k[j] = KEYS[(i - 1) * K + j] end
  for j = 1, P do a[4 + j] = ARGV[5 + (i - 1) * P + j] end
  return k, a
end
local replies = {}
local denied = 0
for i = 1, n do
  local k, a = level(i)
  replies[i] = MAIN(k, a, false)
  if denied == 0 and not allowed(replies[i]) then denied = i end
end
if denied == 0 then
  -- Every level stores the request as a take (as `check_all` in memory takes each level).
  TAKE = true
  for i = 1, n do
    local k, a = level(i)
    MAIN(k, a, true)
  end
else
  local k, a = level(denied)
  MAIN(k, a, true)
end
return replies
