-- concurrency.lua: at most `limit` held at once; an allowed request holds a lease of its
-- cost for `lease_ms`, until it is released or renewed (lua/leases.lua) or runs out.
--
-- KEYS (per entry): a sorted set. Each lease is a member '<token>:<cost>:<taken µs>' scored
--   by its expiry (µs); the member '#' is scored minus the total cost of the leases in the
--   set, so what is held is one ZSCORE, not a sum over every lease. Scores of leases are
--   positive and '#''s never is, so the range (0, now] is exactly the leases that ran out:
--   they are reclaimed (removed, their cost given back to '#') on the next write. TTL: the
--   latest expiry, so a key whose every lease ran out is gone.
-- ARGV (per entry): code "cc", count_denied (ignored: a denied request holds nothing),
--   limit, lease_ms, token (an integer below 2^53 the caller chose for this check; the
--   lease id it hands out names it)
-- Reply (per entry): allowed, limit, remaining (limit minus what is held after this
--   request), reset_ms (until the last lease runs out; a release may come sooner),
--   retry_ms (until enough leases run out for `cost`; -1 when cost > limit or allowed), 0
-- Refund (cluster): removes the lease this check took at `now`.

-- What the leases that ran out by `now` held, and their members.
local function cc_expired(key, now)
  local gone = redis.call('ZRANGEBYSCORE', key, '(0', int(now))
  local freed = 0
  for i = 1, #gone do
    freed = freed + tonumber(match(gone[i], '^[^:]+:(%d+):'))
  end
  return freed, gone
end

-- The write: reclaims the leases that ran out by `prune_to` (false: none did), adds the
-- lease `member` until `lease_end`, sets what is held to `held` and keeps the set `ttl_us`
-- from now (until its latest lease runs out).
local function cc_write(key, prune_to, member, lease_end, held, ttl_us)
  if prune_to then redis.call('ZREMRANGEBYSCORE', key, '(0', int(prune_to)) end
  redis.call('ZADD', key, int(lease_end), member)
  redis.call('ZADD', key, int(-held), '#')
  redis.call('PEXPIRE', key, ttl_ms(ttl_us))
end

ALGORITHMS.cc = function(key, now, cost, limit, lease_ms, token, _)
  local freed = cc_expired(key, now)
  local total = -(tonumber(redis.call('ZSCORE', key, '#')) or 0)
  local held = total - freed
  local allowed = held + cost <= limit
  local retry = -1
  if not allowed and cost <= limit then
    -- The soonest-expiring leases first, 64 at a time by rank (a page by rank costs
    -- O(log N + 64), so the walk is linear in the leases it passes), until enough would
    -- be free. '#' and the leases that ran out rank before every live one.
    local need, got = held + cost - limit, 0
    local rank = redis.call('ZCOUNT', key, '-inf', int(now))
    while retry == -1 do
      local page = redis.call('ZRANGE', key, rank, rank + 63, 'WITHSCORES')
      if #page == 0 then break end
      for i = 1, #page, 2 do
        got = got + tonumber(match(page[i], '^[^:]+:(%d+):'))
        if got >= need then
          retry = ceil_ms(tonumber(page[i + 1]) - now)
          break
        end
      end
      rank = rank + 64
    end
  end
  local consume = cost > 0 and allowed
  local after = held
  if consume then after = held + cost end
  local latest = now
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #top == 2 then latest = max(latest, tonumber(top[2])) end
  if consume then latest = max(latest, now + lease_ms * 1000) end
  local outcome = result(allowed, limit, limit - after, latest - now, retry, 0)
  if consume then
    return outcome, cc_write, freed > 0 and now, format('%d:%d:%d', token, cost, now),
      now + lease_ms * 1000, after, latest - now
  end
  return outcome
end

REFUNDS.cc = function(key, now, cost, limit, lease_ms, token)
  local member = format('%d:%d:%d', token, cost, now)
  if redis.call('ZREM', key, member) == 1 then
    redis.call('ZINCRBY', key, int(cost), '#')
  end
end
