-- policy_import.lua: applies a whole set of policies at once (`spillway policy import`):
-- every policy in the set becomes its next version, or nothing changes.
--
-- KEYS: [1] hash name -> current version, [2] generation counter, [3] hash name -> last
--       version number, then one previous-versions list per policy, in ARGV order
-- ARGV: [1] channel to publish changed names on, then pairs: name, policy document JSON
-- Reply: the number of policies written. No key here has a TTL: policies are kept.
local n = (#ARGV - 1) / 2
assert(n >= 1 and n == math.floor(n) and #KEYS == 3 + n, 'policy_import.lua: 3 + n KEYS, 1 + 2n ARGV')
for i = 1, n do
  local name, doc = ARGV[2 * i], ARGV[2 * i + 1]
  local current = redis.call('HGET', KEYS[1], name)
  if current then redis.call('LPUSH', KEYS[3 + i], current) end
  local version = redis.call('HINCRBY', KEYS[3], name, 1)
  redis.call('HSET', KEYS[1], name, '{"version":' .. version .. ',"policy":' .. doc .. '}')
end
redis.call('INCR', KEYS[2])
for i = 1, n do redis.call('PUBLISH', ARGV[1], ARGV[2 * i]) end
return n
