-- reset.lua: deletes one identifier's rule state under one policy, keeping each key as it
-- was (its DUMP and when it would have expired) in a stash for a short while, so a reset
-- can be undone: a support person who reset the wrong identifier puts its counters back.
--
-- It also marks when the reset happened (the epoch key): a local rule's flush that was on
-- its way from a counter older than the reset is then not applied (check.lua's 'flush:'
-- mode), so no flush undoes a reset.
--
-- KEYS: [1] the stash (a hash in the same slot as the state keys), [2] the epoch key,
--       [3..] the state keys
-- ARGV: [1] how long the stash is kept (ms); 0 keeps none; [2] how long the epoch is kept
--       (ms, longer than any flush is on its way)
-- Reply: how many keys were deleted
--
-- Stash fields: 'd:<key>' the key's DUMP, 'e:<key>' when it expires (ms, 0 for never).
assert(#KEYS >= 2 and #ARGV == 2, 'reset.lua: the stash, the epoch and the state keys, 2 ARGV')
local keep = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- µs, as the check script's clock: a counter seeded at or before it is older than the reset.
redis.call('SET', KEYS[2], tonumber(t[1]) * 1000000 + tonumber(t[2]), 'PX', tonumber(ARGV[2]))
local deleted = 0
for i = 3, #KEYS do
  local data = redis.call('DUMP', KEYS[i])
  if data then
    if keep > 0 then
      local pttl = redis.call('PTTL', KEYS[i])
      local expires = 0
      if pttl >= 0 then expires = now + pttl end
      redis.call('HSET', KEYS[1], 'd:' .. KEYS[i], data, 'e:' .. KEYS[i], expires)
    end
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
  end
end
if deleted > 0 and keep > 0 then redis.call('PEXPIRE', KEYS[1], keep) end
return deleted
