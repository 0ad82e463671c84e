-- leaky_bucket.lua: a bucket of `capacity` that leaks `leak_tokens` per `leak_period_ms`;
-- a request adds `cost` to the level, and fits when the level stays within capacity.
--
-- KEYS (per entry): a string "<level>:<last leak µs>" (level as an exact double);
--   TTL: until the bucket is empty (a missing key is an empty bucket).
-- ARGV (per entry): code "lb", count_denied, capacity, leak_tokens, leak_period_ms
-- Reply (per entry): allowed, capacity, remaining (whole units of room), reset_ms (until
--   empty), retry_ms (until `cost` fits; -1 when cost > capacity or allowed), delay_ms (how
--   long a queueing caller should wait for what is ahead of it to drain; 0 when denied)
-- Refund (cluster): takes `cost` back out of the level.
ALGORITHMS.lb = function(key, now, cost, capacity, leak_tokens, leak_period_ms, count_denied)
  local rate = leak_tokens / (leak_period_ms * 1000)
  local level = 0
  local raw = redis.call('GET', key)
  if raw then
    local sv, sl = match(raw, '^([^:]+):(-?%d+)$')
    local elapsed = max(now - tonumber(sl), 0)
    level = max(tonumber(sv) - elapsed * rate, 0)
  end
  local allowed = level + cost <= capacity
  local delay = 0
  if allowed then delay = level / rate end
  local retry = -1
  if not allowed and cost <= capacity then retry = ceil_ms((level + cost - capacity) / rate) end
  local consume = cost > 0 and (allowed or count_denied)
  if consume then level = min(capacity, level + cost) end
  local reset = level / rate
  local outcome = result(allowed, capacity, floor(capacity - level), reset, retry, ceil_ms(delay))
  if consume then return outcome, write_real_at, level, now, reset end
  return outcome
end

REFUNDS.lb = function(key, now, cost)
  local raw = redis.call('GET', key)
  if not raw then return end
  local sv, sl = match(raw, '^([^:]+):(-?%d+)$')
  redis.call('SET', key, real(max(tonumber(sv) - cost, 0)) .. ':' .. sl, 'KEEPTTL')
end
