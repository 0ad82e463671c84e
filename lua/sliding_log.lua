-- sliding_log.lua: at most `limit` requests in any `window_ms`, exactly.
--
-- KEYS (per entry): a sorted set, one member per unit of cost, scored by admission time
--   (µs); members "<now>:<n>" are unique. Entries older than the window are trimmed on
--   write; it never holds more than `limit` members. TTL: newest entry + window.
-- ARGV (per entry): code "sl", count_denied, limit, window_ms, 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (until the newest entry leaves),
--   retry_ms (until enough old entries leave; -1 when cost > limit or allowed), 0
-- Refund (cluster): removes up to `cost` entries admitted at `now`.
ALGORITHMS.sl = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local horizon = now - window
  local count = redis.call('ZCOUNT', key, '(' .. int(horizon), '+inf')
  local allowed = count + cost <= limit
  local retry = -1
  if not allowed and cost <= limit then
    local k = count + cost - limit
    local kth = redis.call('ZRANGEBYSCORE', key, '(' .. int(horizon), '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
    retry = ceil_ms(tonumber(kth[2]) + window - now)
  end
  local consume = cost > 0 and (allowed or count_denied)
  local added = 0
  if consume then added = math.max(0, math.min(cost, limit - count)) end
  local after = count + added
  local reset = 0
  if added > 0 then
    reset = window
  elseif count > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = tonumber(newest[2]) + window - now
  end
  local commit = nil
  if consume then
    commit = function()
      redis.call('ZREMRANGEBYSCORE', key, '-inf', int(horizon))
      if added > 0 then
        local args = {}
        for i = 1, added do
          args[#args + 1] = int(now)
          args[#args + 1] = int(now) .. ':' .. int(count + i)
        end
        redis.call('ZADD', key, unpack(args))
      end
      redis.call('PEXPIRE', key, ttl_ms(reset))
    end
  end
  return result(allowed, limit, limit - after, reset, retry, 0), commit
end

REFUNDS.sl = function(key, now, cost)
  local mine = redis.call('ZRANGEBYSCORE', key, int(now), int(now), 'LIMIT', 0, cost)
  if #mine > 0 then redis.call('ZREM', key, unpack(mine)) end
end
