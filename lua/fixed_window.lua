-- fixed_window.lua: `limit` per clock-aligned window of `window_ms`.
--
-- KEYS (per entry): the state key, a string "<window index>:<count>"; its TTL is the end of
--   the window, but the window index is kept so a stale value can never be counted.
-- ARGV (per entry): code "fw", count_denied, limit, window_ms, 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (window end, 0 when unused),
--   retry_ms (window end; -1 when cost > limit or allowed), 0
-- Refund (cluster): gives `cost` back to the window of `now`, if it is still current.
ALGORITHMS.fw = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local w = math.floor(now / window)
  local count = 0
  local raw = redis.call('GET', key)
  if raw then
    local sw, sc = string.match(raw, '^(-?%d+):(%d+)$')
    if tonumber(sw) == w then count = tonumber(sc) end
  end
  local to_end = (w + 1) * window - now
  local allowed = count + cost <= limit
  local consume = cost > 0 and (allowed or count_denied)
  local after = count
  if consume then after = count + cost end
  local reset = 0
  if after > 0 then reset = to_end end
  local retry = -1
  if not allowed and cost <= limit then retry = ceil_ms(to_end) end
  local commit = nil
  if consume then
    commit = function()
      redis.call('SET', key, int(w) .. ':' .. int(after), 'PX', ttl_ms(to_end))
    end
  end
  return result(allowed, limit, limit - after, reset, retry, 0), commit
end

REFUNDS.fw = function(key, now, cost, limit, window_ms)
  local raw = redis.call('GET', key)
  if not raw then return end
  local sw, sc = string.match(raw, '^(-?%d+):(%d+)$')
  if tonumber(sw) == math.floor(now / (window_ms * 1000)) then
    redis.call('SET', key, sw .. ':' .. int(math.max(tonumber(sc) - cost, 0)), 'KEEPTTL')
  end
end
