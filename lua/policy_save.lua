-- policy_save.lua: stores a new version of a policy, its overrides in place, or deletes it,
-- atomically.
--
-- KEYS: [1] hash name -> current version
--           "{"version":N,"overrides_rev":R,"policy":{...}}" (R left out while 0)
--       [2] list of previous versions of this policy, newest first
--       [3] generation counter, bumped on every change (instances poll it)
--       [4] hash name -> last version number (kept after delete, so numbers never repeat)
-- ARGV: [1] policy name, [2] 'put', 'overrides' or 'delete', [3] policy document JSON (put
--       and overrides), [4] expected current revision: '' = any, '0' = must not exist,
--       'N' = version N, 'N.R' = version N with its overrides changed R times within it
--       ('overrides' needs one), [5] channel to publish the name on
-- Reply: the new version number (put), the version kept (overrides), 1 or 0 (delete:
--        existed or not), or -1 when the expected revision did not match. No key here has
--        a TTL: policies are kept.
--
-- 'overrides' writes the document in place: the version and the list of versions stay, the
-- overrides' count within the version goes up (so caches and entity tags still change).
assert(#KEYS == 4 and #ARGV == 5, 'policy_save.lua: 4 KEYS and 5 ARGV')
local name, op, doc, expected, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local current = redis.call('HGET', KEYS[1], name)
local rev = 0
if current then
  rev = tonumber(string.match(current, '^{"version":%d+,"overrides_rev":(%d+),')) or 0
end
if expected ~= '' then
  local want, want_rev = string.match(expected, '^(%d+)%.?(%d*)$')
  assert(want, 'policy_save.lua: a bad expected revision')
  local have = tonumber(redis.call('HGET', KEYS[4], name) or '0')
  if not current then have = 0 end
  if have ~= tonumber(want) then return -1 end
  if want_rev ~= '' and tonumber(want_rev) ~= rev then return -1 end
end
if op == 'delete' then
  if not current then return 0 end
  redis.call('LPUSH', KEYS[2], current)
  redis.call('HDEL', KEYS[1], name)
elseif op == 'overrides' then
  assert(expected ~= '', 'policy_save.lua: overrides need an expected revision')
  if not current then return -1 end
  local version = tonumber(redis.call('HGET', KEYS[4], name))
  redis.call('HSET', KEYS[1], name,
    '{"version":' .. version .. ',"overrides_rev":' .. (rev + 1) .. ',"policy":' .. doc .. '}')
  redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', channel, name)
  return version
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
