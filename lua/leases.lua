-- leases.lua: releases or renews leases of concurrency rules (see concurrency.lua for the
-- sorted set each rule keeps per identifier). Appended after prelude.lua.
--
-- KEYS: per lease, its rule's sorted set (on a cluster, one lease per call).
-- ARGV: [1] 'release' or 'renew'; [2] '' for Redis TIME, or now in µs (tests); then per
--   lease: its member ('<token>:<cost>:<taken µs>'), its cost, and (renew) lease_ms.
-- Reply: per lease, an integer.
--   release: 1 when the lease was held and is now released; 0 when it was not held (never
--     taken, released before, or run out: a lease that ran out but was not yet reclaimed is
--     removed too). Releasing is idempotent. A set left with no lease is deleted.
--   renew: the milliseconds until the lease now runs out (now + lease_ms, never earlier
--     than it already ran), or -1 when it is not held (released, or run out: a holder that
--     missed its deadline may already have been replaced, so it must check again).
local mode = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
assert(mode == 'release' or mode == 'renew', 'leases.lua: bad mode')
local per = 2
if mode == 'renew' then per = 3 end
assert(#ARGV == 2 + per * #KEYS, 'leases.lua: expected ' .. per .. ' ARGV per key')

local reply = {}
for i = 1, #KEYS do
  local key, base = KEYS[i], 2 + (i - 1) * per
  local member, cost = ARGV[base + 1], tonumber(ARGV[base + 2])
  local expiry = tonumber(redis.call('ZSCORE', key, member))
  if mode == 'release' then
    local held = 0
    if expiry then
      redis.call('ZREM', key, member)
      local total = -tonumber(redis.call('ZINCRBY', key, int(cost), '#'))
      if total <= 0 and redis.call('ZCARD', key) <= 1 then redis.call('DEL', key) end
      if expiry > now then held = 1 end
    end
    reply[i] = held
  else
    if expiry and expiry > now then
      local until_us = max(expiry, now + tonumber(ARGV[base + 3]) * 1000)
      redis.call('ZADD', key, 'XX', int(until_us), member)
      local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', key, ttl_ms(tonumber(top[2]) - now))
      reply[i] = ceil_ms(until_us - now)
    else
      reply[i] = -1
    end
  end
end
return reply
