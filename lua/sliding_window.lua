-- sliding_window.lua: `limit` per `window_ms`, estimated from the current window's count
-- plus the previous window's weighted by how much of it still overlaps
-- (allowed when floor(previous × overlap) + current + cost ≤ limit).
--
-- KEYS (per entry): a string "<window index>:<current>:<previous>"; TTL: end of the next
--   window, when both counts have aged out.
-- ARGV (per entry): code "sw", count_denied, limit, window_ms, 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (until nothing counts any more),
--   retry_ms (earliest time the estimate admits the cost; -1 when cost > limit or allowed), 0
-- Refund (cluster): gives `cost` back to the window of `now`, if it is still current.

-- The write: window `w`'s count and the previous one's, kept until `ttl_us` from now (one
-- format for the three: int(..) .. ':' .. three times cost 3 % more of a 1-rule check).
local function sw_write(key, w, current, previous, ttl_us)
  redis.call('SET', key, format('%d:%d:%d', w, current, previous), 'PX', ttl_ms(ttl_us))
end

ALGORITHMS.sw = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local w = floor(now / window)
  local current, previous = 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local sw, sc, sp = match(raw, '^(-?%d+):(%d+):(%d+)$')
    sw = tonumber(sw)
    if sw == w then
      current, previous = tonumber(sc), tonumber(sp)
    elseif sw == w - 1 then
      current, previous = 0, tonumber(sc)
    end
  end
  local elapsed = now - w * window
  local weighted = floor(previous * (window - elapsed) / window)
  local allowed = weighted + current + cost <= limit
  local consume = cost > 0 and (allowed or count_denied)
  local current_after = current
  if consume then current_after = current + cost end
  local to_end = window - elapsed
  local reset = 0
  if current_after > 0 then
    reset = to_end + window
  elseif previous > 0 then
    reset = to_end
  end
  local retry = -1
  if not allowed and cost <= limit then
    local spare = limit - current - cost
    if spare >= 0 then
      local x = window - (spare + 1) * window / previous
      retry = ceil_ms((floor(x) + 1) - elapsed)
    else
      local x = window - (limit - cost + 1) * window / current
      retry = ceil_ms(to_end + max(floor(x) + 1, 0))
    end
  end
  local outcome = result(allowed, limit, limit - weighted - current_after, reset, retry, 0)
  if consume then return outcome, sw_write, w, current_after, previous, to_end + window end
  return outcome
end

REFUNDS.sw = function(key, now, cost, limit, window_ms)
  local raw = redis.call('GET', key)
  if not raw then return end
  local sw, sc, sp = match(raw, '^(-?%d+):(%d+):(%d+)$')
  local w = floor(now / (window_ms * 1000))
  if tonumber(sw) == w then
    redis.call('SET', key, sw .. ':' .. int(max(tonumber(sc) - cost, 0)) .. ':' .. sp, 'KEEPTTL')
  end
end
