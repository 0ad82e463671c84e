-- alerts_lease.lua: takes or renews the lease that lets one instance evaluate the alert
-- rules and send their webhooks, so they are evaluated once across all instances.
--
-- KEYS: [1] the lease (a string: the holder's id), with a TTL
-- ARGV: [1] this instance's id, [2] the lease's length in ms
-- Reply: 1 when this instance holds the lease (taken now, or renewed), 0 when another does.
assert(#KEYS == 1 and #ARGV == 2, 'alerts_lease.lua: 1 KEY and 2 ARGV')
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
