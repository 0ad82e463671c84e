-- quota.lua: `limit` per calendar period (a day, week, month or year in a time zone).
--
-- Redis knows no time zones, so the caller works the calendar out (src/domain/calendar.rs)
-- around its own clock and passes four boundaries; the script places Redis's clock among
-- them, so instances whose clocks differ by less than a period still agree on the period.
-- KEYS (per entry): one integer, as fixed_window.lua keeps it: count * 2^20 + (the period's
--   start in whole minutes since the epoch, mod 2^20). Consecutive periods start at least
--   23 hours apart, so the remainder tells them apart. TTL: the end of the period.
-- ARGV (per entry): code "qt", count_denied, limit, '<previous start>:<start>:<end>:<next
--   end>' (µs), 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (to the end of the period, 0 when
--   unused), retry_ms (the same; -1 when cost > limit or allowed), 0
-- Refund (cluster): gives `cost` back to the period of `now`, if it is still current.

-- The period around `now`: its start minute (mod 2^20) and its end (µs).
local function qt_period(now, bounds)
  local p, s, e, n = string.match(bounds, '^(-?%d+):(-?%d+):(-?%d+):(-?%d+)$')
  assert(n, 'quota.lua: bad boundaries')
  p, s, e, n = tonumber(p), tonumber(s), tonumber(e), tonumber(n)
  local start, finish = e, n
  if now < s then
    start, finish = p, s
  elseif now < e then
    start, finish = s, e
  end
  return math.floor(start / 60000000) % FW_SLOTS, finish
end

ALGORITHMS.qt = function(key, now, cost, limit, bounds, _, count_denied)
  local period, finish = qt_period(now, bounds)
  local count = 0
  local raw = tonumber(redis.call('GET', key))
  local current = raw and raw % FW_SLOTS == period
  if current then count = math.floor(raw / FW_SLOTS) end
  local to_end = finish - now
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
        redis.call('INCRBY', key, int((after - count) * FW_SLOTS))
      else
        redis.call('SET', key, int(after * FW_SLOTS + period), 'PX', ttl_ms(to_end))
      end
    end
  end
  return result(allowed, limit, limit - after, reset, retry, 0), commit
end

REFUNDS.qt = function(key, now, cost, limit, bounds)
  local period = qt_period(now, bounds)
  local raw = tonumber(redis.call('GET', key))
  if raw and raw % FW_SLOTS == period then
    local count = math.max(math.floor(raw / FW_SLOTS) - cost, 0)
    redis.call('SET', key, int(count * FW_SLOTS + period), 'KEEPTTL')
  end
end
