-- gcra.lua: the generic cell rate algorithm, as redis-cell's CL.THROTTLE: `rate` per
-- `period_ms` with `burst` extra, so `burst + 1` requests may pass at once.
--
-- KEYS (per entry): a string "<debt>:<at µs>": how many requests (cells) the theoretical
--   arrival time (TAT) stood ahead of `at` when it was written, as an exact double. Counting
--   in requests rather than µs keeps the arithmetic exact at every rate: at 10^9 a second
--   one request is a thousandth of a µs, which a TAT of 1.7e15 µs cannot hold (its doubles
--   are a quarter µs apart). TTL: until the debt has drained (a missing key owes nothing).
--   A bare number is the older layout, a TAT in µs, and is read as such.
-- ARGV (per entry): code "gc", count_denied, rate, period_ms, burst
-- Reply (per entry): allowed, burst + 1, remaining, reset_ms (until TAT), retry_ms
--   (until the request would conform; -1 when cost > burst + 1 or allowed), 0
-- Refund (cluster): takes `cost` requests back off the debt (not below nothing).

-- The debt in requests at `now`, and the key's state as read.
local function gcra_debt(raw, now, rate, period)
  local sd, sa = match(raw, '^([^:]+):(-?%d+)$')
  if not sd then
    -- older layout: the TAT in µs
    return max(tonumber(raw) - now, 0) * rate / period
  end
  return max(tonumber(sd) - max(now - tonumber(sa), 0) * rate / period, 0)
end

ALGORITHMS.gc = function(key, now, cost, rate, period_ms, burst, count_denied)
  local period = period_ms * 1000
  local capacity = burst + 1
  local debt = 0
  local raw = redis.call('GET', key)
  if raw then debt = gcra_debt(raw, now, rate, period) end
  local allowed = debt + cost <= capacity
  local after, retry = debt, -1
  local write = false
  if allowed then
    if cost > 0 then after, write = debt + cost, true end
  else
    if cost <= capacity then retry = ceil_ms((debt + cost - capacity) * period / rate) end
    if count_denied and cost > 0 then
      -- Counted while denied: the bucket is left empty.
      after, write = capacity, true
    end
  end
  local ttl = after * period / rate
  local outcome = result(allowed, capacity, floor(capacity - after), ttl, retry, 0)
  if write then return outcome, write_real_at, after, now, ttl end
  return outcome
end

REFUNDS.gc = function(key, now, cost, rate, period_ms)
  local raw = redis.call('GET', key)
  if not raw then return end
  local debt = gcra_debt(raw, now, rate, period_ms * 1000)
  -- The debt is as of the later of `now` and the stored time (a check after the refunded
  -- one may have written since); stamping it earlier would drain that gap twice.
  local at = now
  local sa = tonumber(match(raw, ':(-?%d+)$'))
  if sa and sa > now then at = sa end
  redis.call('SET', key, real(max(debt - cost, 0)) .. ':' .. int(at), 'KEEPTTL')
end
