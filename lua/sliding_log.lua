-- sliding_log.lua: at most `limit` units of cost in any `window_ms`, exactly.
--
-- KEYS (per entry): a list of admissions, oldest first, one element per counted check (not
--   per unit of its cost): "<time µs>:<total>:<weight>", where `weight` is the units it
--   admitted and `total` the units admitted by it and every element before it while the
--   list lived. So the units inside the window are one subtraction (newest total minus the
--   oldest live element's total before it), and the element where enough of them have left
--   is a binary search. Times only grow along the list: a clock that stepped back appends
--   at the newest time already there. Elements at or before the horizon are trimmed on
--   write; it never holds more than `limit` units inside the window. TTL: newest element +
--   window. Its code, and so its keys' last part, is "lw" (log, weighted): the lists of
--   one element per unit that earlier versions kept under "lg" are left to expire.
-- ARGV (per entry): code "lw", count_denied, limit, window_ms, 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (until the newest element leaves),
--   retry_ms (until enough old units leave; -1 when cost > limit or allowed), 0
-- Worst case, per entry: about 2·log2(n) + 4 LINDEX, one LTRIM, one RPUSH, n the elements
--   in the list (at most `limit`, 100,000), whatever the cost: a cost of 100,000 is one
--   element. (Each element was once one per unit: a cost of 100,000 held Redis 12-27 ms.)
-- Refund (cluster): takes up to `cost` units admitted at `now` or later off the tail.
-- Give back (a negative usage report): takes up to `cost` of the newest units still in the
--   window off the tail.

-- Element `i` of the log (0-based; negative counts from the tail): time, total, weight.
local function lg_at(key, i)
  local t, c, w = match(redis.call('LINDEX', key, i), '^(%-?%d+):(%d+):(%d+)$')
  return tonumber(t), tonumber(c), tonumber(w)
end

-- The first index in [lo, hi] whose element passes `test` (a property that, once true
-- along the list, stays true), knowing the element at `hi` passes.
local function lg_search(key, lo, hi, test)
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if test(lg_at(key, mid)) then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- How many elements at the head are at or before `horizon` (stale), and the list's length.
local function lg_stale(key, horizon)
  local len = redis.call('LLEN', key)
  if len == 0 then return 0, 0 end
  if lg_at(key, 0) > horizon then return 0, len end
  if lg_at(key, -1) <= horizon then return len, len end
  return lg_search(key, 1, len - 1, function(t) return t > horizon end), len
end

-- The write: trims the `stale` head, appends `element` (false: none), and keeps the list
-- `ttl_us` from now (false: the list is empty, nothing to keep).
local function lg_write(key, stale, element, ttl_us)
  if stale > 0 then redis.call('LTRIM', key, stale, -1) end
  if element then redis.call('RPUSH', key, element) end
  if ttl_us then redis.call('PEXPIRE', key, ttl_ms(ttl_us)) end
end

-- Takes up to `cost` units off the tail, from elements admitted after `since`.
local function lg_take(key, cost, since)
  local left = cost
  while left > 0 do
    if redis.call('LLEN', key) == 0 then return end
    local t, c, w = lg_at(key, -1)
    if t <= since then return end
    if w <= left then
      redis.call('RPOP', key)
      left = left - w
    else
      redis.call('LSET', key, -1, format('%d:%d:%d', t, c - left, w - left))
      left = 0
    end
  end
end

ALGORITHMS.lw = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local stale, len = lg_stale(key, now - window)
  local count, total, newest, before = 0, 0, nil, 0
  if len > 0 then
    newest, total = lg_at(key, -1)
    if stale < len then
      local _, c, w = lg_at(key, stale)
      before = c - w
      count = total - before
    else
      newest = nil
    end
  end
  local allowed = count + cost <= limit
  local retry = -1
  if not allowed and cost <= limit then
    local k = count + cost - limit
    local i = lg_search(key, stale, len - 1, function(_, c) return c - before >= k end)
    retry = ceil_ms(lg_at(key, i) + window - now)
  end
  local consume = cost > 0 and (allowed or count_denied)
  local added = 0
  if consume then added = max(0, min(cost, limit - count)) end
  local at = now
  if newest and newest > now then at = newest end
  local after = count + added
  local reset = 0
  if added > 0 then
    reset = at + window - now
  elseif newest then
    reset = newest + window - now
  end
  local outcome = result(allowed, limit, limit - after, reset, retry, 0)
  if consume then
    local element = false
    if added > 0 then element = format('%d:%d:%d', at, total + added, added) end
    return outcome, lg_write, stale, element, after > 0 and reset
  end
  return outcome
end

REFUNDS.lw = function(key, now, cost)
  lg_take(key, cost, now - 1)
end

GIVEBACKS.lw = function(key, now, cost, limit, window_ms)
  lg_take(key, cost, now - window_ms * 1000)
end
