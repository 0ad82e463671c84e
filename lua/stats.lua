-- stats.lua: the live counters the dashboard's overview reads, kept by the check path in the
-- same round trip (and by stats_flush.lua for denials answered from an instance's cache).
-- Never scanned: the overview reads these few keys only.
--
-- Keys (passed in by the caller; every one has a TTL):
--   rate   hash per policy, a circle of 300 one-second buckets: field a<i> (allowed) and
--          d<i> (denied), i = second % 300, each holding second * 2^20 + count. A bucket
--          whose second is not the current one is stale: it is restarted, so a quiet spell
--          never leaks old counts into the chart. Counting is one HINCRBY; only the first
--          count of a bucket in a new second writes again (HSET, and PEXPIRE of the hash).
--          A count that reached 2^20 in one second starts over. TTL 310 s.
--   denied sorted set per minute: member '<policy>|<dimension>=<value>', score = denials in
--          that minute (the identifier that bound). TTL 6 minutes.
--   near   sorted set per minute: member as above, score = the percentage of its limit the
--          identifier had used at its last allowed check, when that was 80 % or more.
--          TTL 2 minutes.

local STATS_SHIFT = 1048576 -- 2^20: a bucket holds second * 2^20 + count

-- Adds `n` to the bucket `field` for second `sec`, restarting it when it held another second.
local function stats_bump(rate, field, sec, n)
  local v = redis.call('HINCRBY', rate, field, n)
  if math.floor(v / STATS_SHIFT) ~= sec then
    redis.call('HSET', rate, field, string.format('%d', sec * STATS_SHIFT + n))
    redis.call('PEXPIRE', rate, 310000)
  end
end

-- Counts `allowed` and `denied` checks of one policy in the bucket of second `sec`.
local function stats_count(rate, sec, allowed, denied)
  local i = sec % 300
  if allowed > 0 then stats_bump(rate, 'a' .. i, sec, allowed) end
  if denied > 0 then stats_bump(rate, 'd' .. i, sec, denied) end
end

local function stats_denied(denied_key, label, n)
  redis.call('ZINCRBY', denied_key, n, label)
  redis.call('PEXPIRE', denied_key, 360000)
end

local function stats_near(near_key, label, pct)
  redis.call('ZADD', near_key, pct, label)
  redis.call('PEXPIRE', near_key, 120000)
end
