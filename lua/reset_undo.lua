-- reset_undo.lua: puts back what reset.lua stashed, each key with the time to live it had
-- left (a key whose time ran out meanwhile stays gone), then drops the stash: an undo is
-- done once. A key written since the reset (a check that came after it) is replaced by
-- what the reset took: the undo means "as before the reset".
--
-- KEYS: [1] the stash, [2..] the state keys
-- ARGV: none
-- Reply: how many keys were put back
assert(#KEYS >= 1 and #ARGV == 0, 'reset_undo.lua: the stash and the state keys, no ARGV')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local restored = 0
for i = 2, #KEYS do
  local data = redis.call('HGET', KEYS[1], 'd:' .. KEYS[i])
  if data then
    local expires = tonumber(redis.call('HGET', KEYS[1], 'e:' .. KEYS[i]) or '0')
    local ttl = 0
    if expires > 0 then ttl = expires - now end
    if expires == 0 or ttl > 0 then
      redis.call('RESTORE', KEYS[i], ttl, data, 'REPLACE')
      restored = restored + 1
    end
  end
end
redis.call('DEL', KEYS[1])
return restored
