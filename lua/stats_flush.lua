-- stats_flush.lua: adds counts that did not come through check.lua to the live counters:
-- an instance's locally answered denials (its over-limit cache, once a second), and checks
-- on a Redis Cluster, where the counters live in another slot. Appended after stats.lua.
--
-- KEYS: [1] the policy's rate hash, [2] the denied sorted set of the current minute
-- ARGV: [1] checks allowed, [2] checks denied, then pairs of
--       (label '<policy>|<dimension>=<value>', denials)
-- Reply: 1
assert(#KEYS == 2 and #ARGV >= 2 and #ARGV % 2 == 0, 'stats_flush.lua: 2 KEYS and 2 + 2n ARGV')
local t = redis.call('TIME')
local sec = tonumber(t[1])
stats_count(KEYS[1], sec, tonumber(ARGV[1]), tonumber(ARGV[2]))
for i = 3, #ARGV, 2 do
  stats_denied(KEYS[2], ARGV[i], tonumber(ARGV[i + 1]))
end
return 1
