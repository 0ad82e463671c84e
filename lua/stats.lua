-- stats.lua: the live counters the dashboard's overview reads, kept by the check path in the
-- same round trip (and by stats_flush.lua for denials answered from an instance's cache).
-- Never scanned: the overview reads these few keys only.
--
-- Keys (passed in by the caller; every one has a TTL):
--   rate   hash per policy, a circle of 300 one-second buckets: field a<i> (allowed),
--          d<i> (denied) and t<i> (the second the bucket holds), i = second % 300. A bucket
--          whose t<i> is not the current second is stale and is zeroed before counting, so a
--          quiet spell never leaks old counts into the chart. TTL 310 s.
--   denied sorted set per minute: member '<policy>|<dimension>=<value>', score = denials in
--          that minute (the identifier that bound). TTL 6 minutes.
--   near   sorted set per minute: member as above, score = the percentage of its limit the
--          identifier had used at its last allowed check, when that was 80 % or more.
--          TTL 2 minutes.

-- Counts `allowed` and `denied` checks of one policy in the bucket of second `sec`.
local function stats_count(rate, sec, allowed, denied)
  local i = sec % 300
  local stamp = 't' .. i
  if redis.call('HGET', rate, stamp) ~= string.format('%d', sec) then
    redis.call('HSET', rate, stamp, string.format('%d', sec), 'a' .. i, 0, 'd' .. i, 0)
    redis.call('PEXPIRE', rate, 310000)
  end
  if allowed > 0 then redis.call('HINCRBY', rate, 'a' .. i, allowed) end
  if denied > 0 then redis.call('HINCRBY', rate, 'd' .. i, denied) end
end

local function stats_denied(denied_key, label, n)
  redis.call('ZINCRBY', denied_key, n, label)
  redis.call('PEXPIRE', denied_key, 360000)
end

local function stats_near(near_key, label, pct)
  redis.call('ZADD', near_key, pct, label)
  redis.call('PEXPIRE', near_key, 120000)
end
