-- fixed_window.lua: `limit` per clock-aligned window of `window_ms`.
--
-- KEYS (per entry): the state key, one integer: count * 2^20 + (window index mod 2^20). Its
--   TTL is the end of the window; the index (mod 2^20) is kept as well, so a value that
--   outlived its TTL by up to a million windows is still never counted. An integer is what
--   Redis stores most compactly (no string allocation): 148 bytes per identifier instead of
--   166 for "<index>:<count>". count saturates at 2^33 - 1 (only counted denials get there:
--   limits stop at 10^9), so the value stays an exact double. A window's first write SETs
--   the key with its TTL; later writes in the same window INCRBY it, which keeps the TTL
--   and costs Redis less than a SET with PX (7.0 against 8.3 µs a check, redis-benchmark).
-- ARGV (per entry): code "fw", count_denied, limit, window_ms, 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (window end, 0 when unused),
--   retry_ms (window end; -1 when cost > limit or allowed), 0
-- Refund (cluster): gives `cost` back to the window of `now`, if it is still current.
ALGORITHMS.fw = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local w = math.floor(now / window)
  local count = 0
  local raw = tonumber(redis.call('GET', key))
  local current = raw and raw % FW_SLOTS == w % FW_SLOTS
  if current then count = math.floor(raw / FW_SLOTS) end
  local to_end = (w + 1) * window - now
  local allowed = count + cost <= limit
  local consume = cost > 0 and (allowed or count_denied)
  local after = count
  if consume then after = math.min(count + cost, FW_MAX_COUNT) end
  local reset = 0
  if after > 0 then reset = to_end end
  local retry = -1
  if not allowed and cost <= limit then retry = ceil_ms(to_end) end
  local commit = nil
  if consume then
    commit = function()
      if current then
        -- The window's key, with its TTL at the window's end already: add to it.
        redis.call('INCRBY', key, int((after - count) * FW_SLOTS))
      else
        redis.call('SET', key, int(after * FW_SLOTS + w % FW_SLOTS), 'PX', ttl_ms(to_end))
      end
    end
  end
  return result(allowed, limit, limit - after, reset, retry, 0), commit
end

REFUNDS.fw = function(key, now, cost, limit, window_ms)
  local raw = tonumber(redis.call('GET', key))
  local w = math.floor(now / (window_ms * 1000))
  if raw and raw % FW_SLOTS == w % FW_SLOTS then
    local count = math.max(math.floor(raw / FW_SLOTS) - cost, 0)
    redis.call('SET', key, int(count * FW_SLOTS + w % FW_SLOTS), 'KEEPTTL')
  end
end
