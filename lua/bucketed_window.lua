-- bucketed_window.lua: `limit` over the last `window_ms`, counted in buckets of `bucket_ms`
-- kept on a circle in one hash (the idea of seed 002).
--
-- KEYS (per entry): a hash; field "<slot>" (absolute bucket index mod n, n = window/bucket)
--   holds that bucket's count, field "t" the newest absolute bucket index written. A write
--   HDELs the slots that went stale since "t", HINCRBYs the current one and renews the TTL
--   (until the newest bucket leaves the window).
-- ARGV (per entry): code "bw", count_denied, limit, window_ms, bucket_ms
-- Reply (per entry): allowed, limit, remaining, reset_ms (until the newest counted bucket
--   leaves), retry_ms (until enough old buckets leave; -1 when cost > limit or allowed), 0
-- Worst case, per entry: one HGETALL and a sort of the buckets the hash holds, at most n
--   (window / bucket, at most 3,600); the check queue sends such a check in a call of its
--   own (src/store/coalesce.rs).
-- Refund (cluster): gives `cost` back to the bucket of `now`, if it is still counted.
-- Give back (a negative usage report): takes `cost` off the newest counted buckets first.
-- The write: drops the `stale` slots, adds `cost` to bucket `cur` (of `n` on the circle),
-- marks it the newest and keeps the hash `ttl_us` from now.
local function bw_write(key, stale, cur, n, cost, ttl_us)
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  redis.call('HINCRBY', key, int(cur % n), cost)
  redis.call('HSET', key, 't', int(cur))
  redis.call('PEXPIRE', key, ttl_ms(ttl_us))
end

ALGORITHMS.bw = function(key, now, cost, limit, window_ms, bucket_ms, count_denied)
  local window = window_ms * 1000
  local bucket = bucket_ms * 1000
  local n = window / bucket
  local cur = floor(now / bucket)
  -- The counted buckets the hash holds (absolute index -> count), and their indexes: only
  -- the fields there are, never a pass over all n slots.
  local counts, held, stale = {}, {}, {}
  local raw = redis.call('HGETALL', key)
  local last = nil
  for i = 1, #raw, 2 do
    if raw[i] == 't' then last = tonumber(raw[i + 1]) end
  end
  local count = 0
  if last then
    for i = 1, #raw, 2 do
      if raw[i] ~= 't' then
        local slot = tonumber(raw[i])
        local a = last - ((last - slot) % n)
        if a > cur - n and a <= cur then
          local c = tonumber(raw[i + 1])
          counts[a] = c
          held[#held + 1] = a
          count = count + c
        else
          stale[#stale + 1] = raw[i]
        end
      end
    end
  end
  table.sort(held)
  local allowed = count + cost <= limit
  local retry = -1
  if not allowed and cost <= limit then
    local need = count + cost - limit
    local freed = 0
    for i = 1, #held do
      local a = held[i]
      freed = freed + counts[a]
      if freed >= need then
        retry = ceil_ms((a + n) * bucket - now)
        break
      end
    end
  end
  local consume = cost > 0 and (allowed or count_denied)
  local after = count
  if consume then
    if not counts[cur] then held[#held + 1] = cur end
    counts[cur] = (counts[cur] or 0) + cost
    after = count + cost
  end
  local reset = 0
  for i = #held, 1, -1 do
    local a = held[i]
    if counts[a] > 0 then
      reset = (a + n) * bucket - now
      break
    end
  end
  local outcome = result(allowed, limit, limit - after, reset, retry, 0)
  if consume then return outcome, bw_write, stale, cur, n, cost, reset end
  return outcome
end

REFUNDS.bw = function(key, now, cost, limit, window_ms, bucket_ms)
  local n = window_ms / bucket_ms
  local a = floor(now / (bucket_ms * 1000))
  local last = tonumber(redis.call('HGET', key, 't'))
  if last and a > last - n then
    local field = int(a % n)
    local left = max(tonumber(redis.call('HGET', key, field) or '0') - cost, 0)
    redis.call('HSET', key, field, int(left))
  end
end

GIVEBACKS.bw = function(key, now, cost, limit, window_ms, bucket_ms)
  local n = window_ms / bucket_ms
  local cur = floor(now / (bucket_ms * 1000))
  local last = tonumber(redis.call('HGET', key, 't'))
  if not last then return end
  -- Slot a % n holds bucket a for every a in (last - n, last]; those after cur - n count.
  local left = cost
  local a = min(cur, last)
  while left > 0 and a > cur - n and a > last - n do
    local field = int(a % n)
    local count = tonumber(redis.call('HGET', key, field) or '0')
    if count > 0 then
      local take = min(count, left)
      redis.call('HSET', key, field, int(count - take))
      left = left - take
    end
    a = a - 1
  end
end
