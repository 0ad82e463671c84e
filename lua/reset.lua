-- reset.lua: deletes one identifier's rule state under one policy, keeping each key as it
-- was (its DUMP and when it would have expired) in a stash for a short while, so a reset
-- can be undone: a support person who reset the wrong identifier puts its counters back.
--
-- KEYS: [1] the stash (a hash in the same slot as the state keys), [2..] the state keys
-- ARGV: [1] how long the stash is kept (ms); 0 keeps none
-- Reply: how many keys were deleted
--
-- Stash fields: 'd:<key>' the key's DUMP, 'e:<key>' when it expires (ms, 0 for never).
assert(#KEYS >= 1 and #ARGV == 1, 'reset.lua: the stash and the state keys, 1 ARGV')
local keep = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deleted = 0
for i = 2, #KEYS do
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
