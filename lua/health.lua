-- health.lua: readiness probe. Proves that Redis accepts and runs scripts, not just PING.
--
-- KEYS: none
-- ARGV: none
-- Reply: { seconds, microseconds } of the Redis server clock (TIME), the clock every
--        algorithm script uses.
assert(#KEYS == 0 and #ARGV == 0, 'health.lua takes no KEYS and no ARGV')
local t = redis.call('TIME')
return { tonumber(t[1]), tonumber(t[2]) }
