-- Two quotas on one key, all-or-nothing (`AllOf`): `NAME`, `FIRST`, `SECOND`, `K1` (the
-- first's key count), `N1`/`N2` (the parameter counts) are replaced. Both decide on the
-- current state without storing; then, when storing, both store if both allowed, else each
-- that denied stores what its own policy makes of the denial (deciding again on the same
-- state and time gives the same decision). The reply is the pair of replies.
local function NAME(KEYS, ARGV, write)
  local k1, a1, k2, a2 = {}, {}, {}, {}
  for i = 1, #KEYS do
    if i <= K1 then k1[i] = KEYS[i] else k2[i - K1] = KEYS[i] end
  end
  for i = 1, N1 do a1[4 + i] = ARGV[4 + i] end
  for i = 1, N2 do a2[4 + i] = ARGV[4 + N1 + i] end
  -- Both quotas admitted the settled request, so both settle it.
  if SETTLE then
    FIRST(k1, a1, true)
    SECOND(k2, a2, true)
    return
  end
  local r1 = FIRST(k1, a1, false)
  local r2 = SECOND(k2, a2, false)
  if write then
    local ok1, ok2 = allowed(r1), allowed(r2)
    if not ok1 or ok2 then FIRST(k1, a1, true) end
    if not ok2 or ok1 then SECOND(k2, a2, true) end
  end
  return {r1, r2}
end
