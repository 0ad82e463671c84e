-- gcra.lua: the generic cell rate algorithm, as redis-cell's CL.THROTTLE: `rate` per
-- `period_ms` with `burst` extra, so `burst + 1` requests may pass at once.
--
-- KEYS (per entry): a string, the theoretical arrival time (TAT) in µs as an exact double;
--   TTL: until the TAT (a missing key is a TAT in the past).
-- ARGV (per entry): code "gc", count_denied, rate, period_ms, burst
-- Reply (per entry): allowed, burst + 1, remaining, reset_ms (until TAT), retry_ms
--   (until the request would conform; -1 when cost > burst + 1 or allowed), 0
-- Refund (cluster): moves the TAT back by `cost` emission intervals (not before now).
ALGORITHMS.gc = function(key, now, cost, rate, period_ms, burst, count_denied)
  local emission = period_ms * 1000 / rate
  local tolerance = emission * (burst + 1)
  local increment = emission * cost
  local tat = now
  local raw = redis.call('GET', key)
  if raw then tat = math.max(tonumber(raw), now) end
  local new_tat = tat + increment
  local allow_at = new_tat - tolerance
  local diff = now - allow_at
  local allowed = diff >= 0
  local ttl, stored, retry = 0, nil, -1
  if allowed then
    ttl = new_tat - now
    if cost > 0 then stored = new_tat end
  else
    if increment <= tolerance then retry = ceil_ms(-diff) end
    if count_denied and cost > 0 then
      -- Counted while denied: the bucket is left empty.
      local full = now + tolerance
      ttl = full - now
      stored = full
    else
      ttl = tat - now
    end
  end
  local next = tolerance - ttl
  local remaining = 0
  if next > 0 then remaining = math.floor(next / emission) end
  local commit = nil
  if stored then
    commit = function()
      redis.call('SET', key, real(stored), 'PX', ttl_ms(stored - now))
    end
  end
  return result(allowed, burst + 1, remaining, ttl, retry, 0), commit
end

REFUNDS.gc = function(key, now, cost, rate, period_ms)
  local raw = redis.call('GET', key)
  if not raw then return end
  local tat = math.max(tonumber(raw) - (period_ms * 1000 / rate) * cost, now)
  redis.call('SET', key, real(tat), 'KEEPTTL')
end
