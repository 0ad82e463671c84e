-- bucketed_window.lua: `limit` over the last `window_ms`, counted in buckets of `bucket_ms`
-- kept on a circle in one hash (the idea of seed 002).
--
-- KEYS (per entry): a hash; field "<slot>" (absolute bucket index mod n, n = window/bucket)
--   holds that bucket's count, field "t" the newest absolute bucket index written, field
--   "s" the running total of the buckets it holds (those in (t - n, t]). A write HDELs the
--   slots that went stale since "t", HINCRBYs the current one, sets "t" and "s" and renews
--   the TTL (until the newest bucket leaves the window).
-- ARGV (per entry): code "bw", count_denied, limit, window_ms, bucket_ms
-- Reply (per entry): allowed, limit, remaining, reset_ms (until the newest counted bucket
--   leaves), retry_ms (until enough old buckets leave; -1 when cost > limit or allowed), 0
-- Cost: an allowed check reads "t", "s" and the buckets that left the window since "t"
--   (HMGET; none within a bucket's time), so it costs what expired, not what the hash holds
--   (a hash of 3,600 buckets read whole cost 35-102 ms and held up other checks). A denial
--   reads the held buckets from the oldest until enough of them would have left (its
--   retry). A hash without "s" (written before it was kept), or a clock behind "t", is read
--   whole once.
-- Refund (cluster): gives `cost` back to the bucket of `now`, if it is still counted.
-- Give back (a negative usage report): takes `cost` off the newest counted buckets first.
-- The write: drops the `stale` slots ('all': the whole hash), adds `cost` to bucket `cur`
-- (of `n` on the circle), marks it the newest with the total `sum`, and keeps the hash
-- `ttl_us` from now.
local function bw_write(key, stale, plan, ttl_us)
  if stale == 'all' then
    redis.call('DEL', key)
  elseif #stale > 0 then
    redis.call('HDEL', key, unpack(stale))
  end
  redis.call('HINCRBY', key, int(plan.cur % plan.n), plan.cost)
  redis.call('HSET', key, 't', int(plan.cur), 's', int(plan.sum))
  redis.call('PEXPIRE', key, ttl_ms(ttl_us))
end

-- The counts of buckets `from`..`to` (absolute indexes, `step` 1 or -1) that `key` holds,
-- read in chunks of 64 until `enough(a, count)` says stop; returns the bucket it stopped at.
local function bw_scan(key, n, from, to, step, enough)
  local a = from
  while (step > 0 and a <= to) or (step < 0 and a >= to) do
    local fields, indexes = {}, {}
    while #fields < 64 and ((step > 0 and a <= to) or (step < 0 and a >= to)) do
      fields[#fields + 1] = int(a % n)
      indexes[#indexes + 1] = a
      a = a + step
    end
    local counts = redis.call('HMGET', key, unpack(fields))
    for i = 1, #fields do
      local c = tonumber(counts[i]) or 0
      if enough(indexes[i], c) then return indexes[i] end
    end
  end
  return nil
end

-- The whole hash read at once: each counted bucket's count, their indexes, the stale slots
-- and the total (for a hash without a total, or a clock behind its newest bucket).
local function bw_read_all(key, cur, n)
  local counts, held, stale = {}, {}, {}
  local raw = redis.call('HGETALL', key)
  local last = nil
  for i = 1, #raw, 2 do
    if raw[i] == 't' then last = tonumber(raw[i + 1]) end
  end
  local count = 0
  if last then
    for i = 1, #raw, 2 do
      if raw[i] ~= 't' and raw[i] ~= 's' then
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
  return counts, held, stale, count
end

ALGORITHMS.bw = function(key, now, cost, limit, window_ms, bucket_ms, count_denied)
  local window = window_ms * 1000
  local bucket = bucket_ms * 1000
  local n = window / bucket
  local cur = floor(now / bucket)
  local state = redis.call('HMGET', key, 't', 's')
  local last, total = tonumber(state[1]), tonumber(state[2])
  local count, stale
  local counts, held = nil, nil
  if not last then
    count, stale = 0, {}
  elseif total and cur >= last then
    if cur - last >= n then
      -- Every bucket it holds has left.
      count, stale = 0, 'all'
    else
      -- The buckets that left since `last`: (last - n, cur - n].
      count, stale = total, {}
      if cur > last then
        local fields = {}
        for a = last - n + 1, cur - n do fields[#fields + 1] = int(a % n) end
        local gone = redis.call('HMGET', key, unpack(fields))
        for i = 1, #fields do
          local c = tonumber(gone[i])
          if c then
            count = count - c
            stale[#stale + 1] = fields[i]
          end
        end
      end
    end
  else
    counts, held, stale, count = bw_read_all(key, cur, n)
  end
  local allowed = count + cost <= limit
  local retry = -1
  if not allowed and cost <= limit then
    -- From the oldest counted bucket up, until enough would have left.
    local need, freed = count + cost - limit, 0
    local at
    if counts then
      for i = 1, #held do
        freed = freed + counts[held[i]]
        if freed >= need then at = held[i] break end
      end
    else
      -- Buckets after `last` were never written: their slots hold older, stale buckets.
      at = bw_scan(key, n, cur - n + 1, min(last, cur), 1, function(_, c)
        freed = freed + c
        return freed >= need
      end)
    end
    if at then retry = ceil_ms((at + n) * bucket - now) end
  end
  local consume = cost > 0 and (allowed or count_denied)
  local after = count
  if consume then after = count + cost end
  -- Until the newest bucket with a count leaves.
  local newest
  if consume then
    newest = cur
  elseif count > 0 then
    if counts then
      for i = #held, 1, -1 do
        if counts[held[i]] > 0 then newest = held[i] break end
      end
    else
      newest = bw_scan(key, n, min(last, cur), cur - n + 1, -1, function(_, c) return c > 0 end)
    end
  end
  local reset = 0
  if newest then reset = (newest + n) * bucket - now end
  local outcome = result(allowed, limit, limit - after, reset, retry, 0)
  if consume then
    return outcome, bw_write, stale, { cur = cur, n = n, cost = cost, sum = after }, reset
  end
  return outcome
end

REFUNDS.bw = function(key, now, cost, limit, window_ms, bucket_ms)
  local n = window_ms / bucket_ms
  local a = floor(now / (bucket_ms * 1000))
  local last = tonumber(redis.call('HGET', key, 't'))
  if last and a > last - n then
    local field = int(a % n)
    local was = tonumber(redis.call('HGET', key, field) or '0')
    local left = max(was - cost, 0)
    redis.call('HSET', key, field, int(left))
    if redis.call('HEXISTS', key, 's') == 1 then redis.call('HINCRBY', key, 's', int(left - was)) end
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
      if redis.call('HEXISTS', key, 's') == 1 then redis.call('HINCRBY', key, 's', -int(take)) end
      left = left - take
    end
    a = a - 1
  end
end
