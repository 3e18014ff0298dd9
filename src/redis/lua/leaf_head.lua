-- Opens the function around one algorithm's body: `key` is its first key, `KEYS` and
-- `ARGV` its own (parameters from `ARGV[5]`), `write` whether to store. `NAME` is replaced.
-- The body ends with `return reply(...)`; `end` closes it.
local function NAME(KEYS, ARGV, write)
local key = KEYS[1]
local function store(val, idle_at)
  redis.call('SET', key, val, 'PX', ttl_ms(idle_at))
end
