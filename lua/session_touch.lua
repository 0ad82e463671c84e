-- session_touch.lua: reads a session and renews its idle timeout, in one round trip.
--
-- KEYS: [1] the session hash (fields: user, role, csrf, created_ms, expires_ms)
-- ARGV: [1] now in ms, [2] the idle timeout in ms
-- Reply: nil when there is no such session or it passed its absolute expiry (then it is
--        deleted); otherwise the hash as a flat field/value array. The key's TTL becomes
--        the idle timeout, but never beyond the absolute expiry.
assert(#KEYS == 1 and #ARGV == 2, 'session_touch.lua: 1 KEY and 2 ARGV')
local now, idle = tonumber(ARGV[1]), tonumber(ARGV[2])
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return nil end
local expires
for i = 1, #fields, 2 do
  if fields[i] == 'expires_ms' then expires = tonumber(fields[i + 1]) end
end
if not expires or expires <= now then
  redis.call('DEL', KEYS[1])
  return nil
end
redis.call('PEXPIRE', KEYS[1], math.min(idle, expires - now))
return fields
