-- token_bucket.lua: a bucket of `capacity` tokens refilled continuously at `refill_tokens`
-- per `refill_period_ms`; a request takes `cost` tokens.
--
-- KEYS (per entry): a string "<tokens>:<last refill µs>" (tokens as an exact double);
--   TTL: until the bucket is full again (a missing key is a full bucket).
-- ARGV (per entry): code "tb", count_denied, capacity, refill_tokens, refill_period_ms
-- Reply (per entry): allowed, capacity, remaining (whole tokens), reset_ms (until full),
--   retry_ms (until `cost` tokens are there; -1 when cost > capacity or allowed), 0
-- Refund (cluster): puts `cost` tokens back, up to capacity.
ALGORITHMS.tb = function(key, now, cost, capacity, refill_tokens, refill_period_ms, count_denied)
  local rate = refill_tokens / (refill_period_ms * 1000)
  local tokens = capacity
  local raw = redis.call('GET', key)
  if raw then
    local st, sl = match(raw, '^([^:]+):(-?%d+)$')
    local elapsed = max(now - tonumber(sl), 0)
    tokens = min(capacity, tonumber(st) + elapsed * rate)
  end
  local allowed = cost <= tokens
  local retry = -1
  if not allowed and cost <= capacity then retry = ceil_ms((cost - tokens) / rate) end
  local consume = cost > 0 and (allowed or count_denied)
  if consume then tokens = max(tokens - cost, 0) end
  local reset = (capacity - tokens) / rate
  local outcome = result(allowed, capacity, floor(tokens), reset, retry, 0)
  if consume then return outcome, write_real_at, tokens, now, reset end
  return outcome
end

REFUNDS.tb = function(key, now, cost, capacity)
  local raw = redis.call('GET', key)
  if not raw then return end
  local st, sl = match(raw, '^([^:]+):(-?%d+)$')
  redis.call('SET', key, real(min(capacity, tonumber(st) + cost)) .. ':' .. sl, 'KEEPTTL')
end
