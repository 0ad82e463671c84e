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
-- The counting itself is `counted` in prelude.lua, which quota.lua shares.
ALGORITHMS.fw = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local w = floor(now / window)
  return counted(key, w % FW_SLOTS, (w + 1) * window - now, cost, limit, count_denied, false)
end

REFUNDS.fw = function(key, now, cost, limit, window_ms)
  counted_refund(key, floor(now / (window_ms * 1000)) % FW_SLOTS, cost)
end
