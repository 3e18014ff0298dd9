-- Shared by every script: the time, the reply, `honest_wait`, the expiry; then come the
-- algorithm's functions (`LEAF_HEAD`, `ALL_OF`) and the call of the outermost.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local ups = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
-- ARGV[4], the request: '0' peek, '1' check, 't' take (a check that also returns `now`),
-- 'u' a partial grant of up to `cost`, 's' settle (the charged cost in ARGV[3], then after
-- the parameters the time of the take and the actual cost; the last key is the
-- reservation's mark).
local MODE = ARGV[4]
local WRITE = MODE ~= '0'
local SETTLE = MODE == 's'
-- A take, whose settle may correct its cost, stores what `Algorithm::take` does (a hierarchy's
-- levels too: levels.lua sets it before they store).
local TAKE = MODE == 't'
local TAKEN, CHARGED, ACTUAL
-- How long a settle's mark lives: set by the tail once the settle has run (an in-flight
-- permit's keeps it as long as its lease).
local MARK_MS = SETTLE_MARK_MS
if SETTLE then
  TAKEN = tonumber(ARGV[#ARGV - 1])
  ACTUAL = tonumber(ARGV[#ARGV])
  CHARGED = cost
end
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
