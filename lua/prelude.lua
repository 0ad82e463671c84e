-- prelude.lua: helpers shared by every algorithm. Not a script on its own: Rust assembles
-- the check script as prelude.lua + one file per algorithm + check.lua, so a check of any
-- mix of algorithms is still ONE script and ONE round trip.
--
-- Every algorithm file adds one function to ALGORITHMS under its code:
--   ALGORITHMS[code](key, now, cost, p1, p2, p3, count_denied) -> result, write, w1..w5
-- `result` is { allowed (1|0), limit, remaining, reset_ms, retry_ms (-1 = none), delay_ms }
-- and reads nothing but `key`; `write` is nil or a function that, called as
-- write(key, w1, w2, w3, w4, w5), writes the new state (with a TTL) as if the request were
-- counted; a step returns one only when it would count the request (cost > 0, and allowed
-- or count_denied). Nothing is written until check.lua decides. A function of the file's
-- own and its arguments rather than a closure over the step's locals: making that closure
-- (one upvalue object per local it captures) was 5 % of a fixed-window check in a batch.
-- Each also adds REFUNDS[code](key, now, cost, p1, p2, p3), which gives back what the write
-- of a check at `now` consumed (Redis Cluster: a later slot denied); the key's TTL is kept.
-- A usage report with a negative cost gives back what a check consumed earlier:
-- GIVEBACKS[code] where the algorithm has one (the newest entries of a log, the newest
-- buckets), otherwise its REFUNDS at the time of the report; never below nothing.
-- Numbers are doubles; src/domain/algorithm.rs (and algorithm/) mirrors every operation in the same order.

-- The library functions a check calls most, as locals: an upvalue is read without the two
-- table lookups of `math.floor` (a global, then its field): a few percent of a check in
-- Redis (benches/DESIGN.md). The files appended after this one use these names.
local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local format, match, tonumber = string.format, string.match, tonumber

local ALGORITHMS = {}
local REFUNDS = {}
local GIVEBACKS = {}

-- How many windows (or quota periods) a stored fixed-window count tells apart, and where
-- its count saturates so that count * FW_SLOTS stays an exact double (fixed_window.lua).
local FW_SLOTS = 1048576
local FW_MAX_COUNT = 8589934591

-- A parameter from ARGV: a number, or text for the few that are not (a quota's
-- boundaries). Each distinct text is converted once a call: the checks of a batch repeat
-- their rules' parameters, and Lua's tonumber is a strtod.
local params = {}
local function param(x)
  local v = params[x]
  if v == nil then
    v = tonumber(x) or x
    params[x] = v
  end
  return v
end

-- The longest duration a reply or a TTL carries: 10^13 ms (317 years). A rule that refills
-- one token in 400 days with a capacity of 10^9 takes 10^9 times that to fill again, which
-- Redis cannot take as a TTL (PX overflows) nor reply as an integer; past this cap the state
-- outlives anyone who could tell. It also keeps every reply number within the 14 digits
-- Lua 5.1 writes exactly (the batch reply is text).
local MAX_MS = 10000000000000

-- Milliseconds, rounded up, of a duration in microseconds (0 for none), at most MAX_MS.
local function ceil_ms(us)
  if us <= 0 then return 0 end
  return min(ceil(us / 1000), MAX_MS)
end

-- A TTL in milliseconds: rounded up, plus one. Redis counts expiry in whole milliseconds
-- from a clock that can be up to one behind the script's TIME: measured on Redis 7.0 under
-- load, 3 in 5000 keys given 1 ms inside a script were gone within 30 µs (a sliding log of a
-- 1 ms window lost its entry), none of 5000 given 2 ms. With one more, a key outlives its state.
local function ttl_ms(us)
  return ceil_ms(us) + 1
end

-- Integers as exact decimal text (tostring would round past 14 digits).
local function int(n)
  return format('%d', n)
end

-- Doubles as text that reads back to the same double.
local function real(x)
  return format('%.17g', x)
end

local function result(allowed, limit, remaining, reset_us, retry_ms, delay_ms)
  return { allowed and 1 or 0, limit, max(0, remaining), ceil_ms(reset_us), retry_ms, delay_ms }
end

-- A write: the string '<x as an exact double>:<at µs>' with a TTL of `ttl_us` (the state of
-- token buckets, leaky buckets and GCRA): real(x) .. ':' .. int(at) in one format, which
-- spares a GCRA check 5 % of its time in Redis.
local function write_real_at(key, x, at, ttl_us)
  redis.call('SET', key, format('%.17g:%d', x, at), 'PX', ttl_ms(ttl_us))
end

-- The write of `counted`: `value` added to the window's key (`current`; its TTL already
-- ends with the window, renewed when `refresh`), or set as the key of a new window.
local function counted_write(key, current, value, to_end, refresh)
  if current then
    redis.call('INCRBY', key, int(value))
    if refresh then redis.call('PEXPIRE', key, ttl_ms(to_end)) end
  else
    redis.call('SET', key, int(value), 'PX', ttl_ms(to_end))
  end
end

-- A count kept as fixed_window.lua keeps it (count * FW_SLOTS + its window's id, the window
-- index or quota period mod FW_SLOTS) that starts again where its window ends, `to_end` µs
-- from now: the result and the write for `cost` (fixed windows and quotas). `refresh`
-- sets the TTL on every write, not only the window's first: a quota whose calendar changed
-- (day to month on the 1st) can find a count of the same start minute, whose TTL ends with
-- the old period.
local function counted(key, id, to_end, cost, limit, count_denied, refresh)
  local count = 0
  local raw = tonumber(redis.call('GET', key))
  local current = raw and raw % FW_SLOTS == id
  if current then count = floor(raw / FW_SLOTS) end
  local allowed = count + cost <= limit
  local consume = cost > 0 and (allowed or count_denied)
  local after = count
  if consume then after = min(count + cost, FW_MAX_COUNT) end
  local reset = 0
  if after > 0 then reset = to_end end
  local retry = -1
  if not allowed and cost <= limit then retry = ceil_ms(to_end) end
  local outcome = result(allowed, limit, limit - after, reset, retry, 0)
  if not consume then return outcome end
  if current then
    return outcome, counted_write, true, (after - count) * FW_SLOTS, to_end, refresh
  end
  return outcome, counted_write, false, after * FW_SLOTS + id, to_end
end

-- Gives `cost` back to such a count if it is still the window `id`'s; its TTL is kept.
local function counted_refund(key, id, cost)
  local raw = tonumber(redis.call('GET', key))
  if raw and raw % FW_SLOTS == id then
    local count = max(floor(raw / FW_SLOTS) - cost, 0)
    redis.call('SET', key, int(count * FW_SLOTS + id), 'KEEPTTL')
  end
end
