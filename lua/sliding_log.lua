-- sliding_log.lua: at most `limit` requests in any `window_ms`, exactly.
--
-- KEYS (per entry): a list of admission times in µs, oldest first, one element per unit of
--   cost. Redis keeps a list of integers packed (about 10 bytes an element at any length),
--   where a sorted set costs 35 bytes an entry while small and 140 once it is a skiplist.
--   Times only grow along the list: a clock that stepped back appends at the newest time
--   already there. Elements at or before the horizon are trimmed on write; it never holds
--   more than `limit` elements inside the window. TTL: newest element + window.
-- ARGV (per entry): code "lg", count_denied, limit, window_ms, 0
-- Reply (per entry): allowed, limit, remaining, reset_ms (until the newest element leaves),
--   retry_ms (until enough old elements leave; -1 when cost > limit or allowed), 0
-- Refund (cluster): removes up to `cost` elements admitted at `now` or later from the tail.
-- Give back (a negative usage report): removes up to `cost` of the newest elements still in
--   the window.

-- Elements one RPUSH appends at most.
local LOG_PUSH_CHUNK = 4096

-- How many elements at the head are at or before `horizon` (stale), and the list's length.
-- Trimming on every write keeps the stale run short, so this is usually one LINDEX.
local function log_stale(key, horizon)
  local len = redis.call('LLEN', key)
  if len == 0 then return 0, 0 end
  local head = redis.call('LINDEX', key, 0)
  if tonumber(head) > horizon then return 0, len end
  local start = 1
  while start < len do
    local chunk = redis.call('LRANGE', key, start, start + 31)
    for i = 1, #chunk do
      if tonumber(chunk[i]) > horizon then return start + i - 1, len end
    end
    start = start + #chunk
  end
  return len, len
end

-- The write: trims the `stale` head, appends `added` elements admitted at `at`, and keeps
-- the list `ttl_us` from now (false: the list is empty, nothing to keep).
local function lg_write(key, stale, added, at, ttl_us)
  if stale > 0 then redis.call('LTRIM', key, stale, -1) end
  if added > 0 then
    -- Lua unpacks at most about 8000 values into one call (LUAI_MAXCSTACK); a cost up
    -- to the largest limit (100,000) goes in chunks.
    local value = int(at)
    local args = {}
    for i = 1, min(added, LOG_PUSH_CHUNK) do args[i] = value end
    local left = added
    while left >= LOG_PUSH_CHUNK do
      redis.call('RPUSH', key, unpack(args))
      left = left - LOG_PUSH_CHUNK
    end
    if left > 0 then redis.call('RPUSH', key, unpack(args, 1, left)) end
  end
  if ttl_us then redis.call('PEXPIRE', key, ttl_ms(ttl_us)) end
end

ALGORITHMS.lg = function(key, now, cost, limit, window_ms, _, count_denied)
  local window = window_ms * 1000
  local horizon = now - window
  local stale, len = log_stale(key, horizon)
  local count = len - stale
  local newest = nil
  if count > 0 then newest = tonumber(redis.call('LINDEX', key, -1)) end
  local allowed = count + cost <= limit
  local retry = -1
  if not allowed and cost <= limit then
    local k = count + cost - limit
    local kth = tonumber(redis.call('LINDEX', key, stale + k - 1))
    retry = ceil_ms(kth + window - now)
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
  if consume then return outcome, lg_write, stale, added, at, after > 0 and reset end
  return outcome
end

REFUNDS.lg = function(key, now, cost)
  local tail = redis.call('LRANGE', key, -cost, -1)
  local mine = 0
  for i = #tail, 1, -1 do
    if tonumber(tail[i]) >= now then mine = mine + 1 else break end
  end
  if mine > 0 then redis.call('RPOP', key, mine) end
end

GIVEBACKS.lg = function(key, now, cost, limit, window_ms)
  local stale, len = log_stale(key, now - window_ms * 1000)
  local take = min(cost, len - stale)
  if take > 0 then redis.call('RPOP', key, take) end
end
