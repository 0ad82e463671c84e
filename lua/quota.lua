-- quota.lua: `limit` per calendar period (a day, week, month or year in a time zone).
--
-- Redis knows no time zones, so the caller works the calendar out (src/domain/calendar.rs)
-- around its own clock and passes four boundaries; the script places Redis's clock among
-- them, so instances whose clocks differ by less than a period still agree on the period.
-- KEYS (per entry): one integer, as fixed_window.lua keeps it: count * 2^20 + (the period's
--   start in whole minutes since the epoch, mod 2^20). Consecutive periods start at least
--   23 hours apart, so the remainder tells them apart. TTL: the end of the period, set on
--   every write (a calendar edited to another period that starts on the same minute keeps
--   the count, and must not keep the old period's end).
-- ARGV (per entry): code "qt", count_denied, limit, '<previous start>:<start>:<end>:<next
--   end>' (µs), 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (to the end of the period, 0 when
--   unused), retry_ms (the same; -1 when cost > limit or allowed), 0
-- Refund (cluster): gives `cost` back to the period of `now`, if it is still current.

-- The period around `now`: its start minute (mod 2^20) and its end (µs).
local function qt_period(now, bounds)
  local p, s, e, n = match(bounds, '^(-?%d+):(-?%d+):(-?%d+):(-?%d+)$')
  assert(n, 'quota.lua: bad boundaries')
  p, s, e, n = tonumber(p), tonumber(s), tonumber(e), tonumber(n)
  local start, finish = e, n
  if now < s then
    start, finish = p, s
  elseif now < e then
    start, finish = s, e
  end
  return floor(start / 60000000) % FW_SLOTS, finish
end

ALGORITHMS.qt = function(key, now, cost, limit, bounds, _, count_denied)
  local period, finish = qt_period(now, bounds)
  return counted(key, period, finish - now, cost, limit, count_denied, true)
end

REFUNDS.qt = function(key, now, cost, limit, bounds)
  counted_refund(key, qt_period(now, bounds), cost)
end
