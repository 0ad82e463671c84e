-- policy_save.lua: stores a new version of a policy, or deletes it, atomically.
--
-- KEYS: [1] hash name -> current version "{"version":N,"policy":{...}}"
--       [2] list of previous versions of this policy, newest first
--       [3] generation counter, bumped on every change (instances poll it)
--       [4] hash name -> last version number (kept after delete, so numbers never repeat)
-- ARGV: [1] policy name, [2] 'put' or 'delete', [3] policy document JSON (put only),
--       [4] expected current version ('' = any; '0' = must not exist), [5] channel to
--       publish the name on
-- Reply: the new version number (put), 1 or 0 (delete: existed or not), or -1 when the
--        expected version did not match. No key here has a TTL: policies are kept.
assert(#KEYS == 4 and #ARGV == 5, 'policy_save.lua: 4 KEYS and 5 ARGV')
local name, op, doc, expected, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local current = redis.call('HGET', KEYS[1], name)
if expected ~= '' then
  local have = tonumber(redis.call('HGET', KEYS[4], name) or '0')
  if not current then have = 0 end
  if have ~= tonumber(expected) then return -1 end
end
if op == 'delete' then
  if not current then return 0 end
  redis.call('LPUSH', KEYS[2], current)
  redis.call('HDEL', KEYS[1], name)
else
  local version = redis.call('HINCRBY', KEYS[4], name, 1)
  if current then redis.call('LPUSH', KEYS[2], current) end
  redis.call('HSET', KEYS[1], name, '{"version":' .. version .. ',"policy":' .. doc .. '}')
  redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', channel, name)
  return version
end
redis.call('INCR', KEYS[3])
redis.call('PUBLISH', channel, name)
return 1
