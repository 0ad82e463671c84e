-- streaks.lua: denials as a state. A streak runs from an identifier's first denial under a
-- policy until a minute passes without one; it holds since when, the last denial, and the
-- checks and denials counted since (each identifier of a denied check credited). Written by
-- each instance once a second from what it answered (service::live), off the check path:
-- an instance counts an identifier's checks from its own first denial of it.
--
-- KEYS: [1] the policy's streaks of the current hour (hash, field: '<dimension>=<value>';
--       value: 'since_ms,last_ms,checks,denials'), [2] those of the previous hour
-- ARGV: [1] now (ms), then 5 per identifier: identifier, checks, denials, first denial ms
--       and last denial ms of this flush (0 and 0 when none)
-- Reply: 1
--
-- A streak still running at the hour's turn is carried into the new hour's hash; a hash
-- lives two hours, so memory is bounded by the identifiers denied in two hours.
assert(#KEYS == 2 and #ARGV % 5 == 1, 'streaks.lua: 2 KEYS and 1 + 5n ARGV')
local GAP = 60000
local now = tonumber(ARGV[1])
local touched = false
for b = 2, #ARGV, 5 do
  local id = ARGV[b]
  local checks, denials = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local first, last = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local old = redis.call('HGET', KEYS[1], id) or redis.call('HGET', KEYS[2], id)
  local since, l, c, d
  if old then
    since, l, c, d = string.match(old, '^(%d+),(%d+),(%d+),(%d+)$')
    since, l, c, d = tonumber(since), tonumber(l), tonumber(c), tonumber(d)
  end
  local running = l and ((denials > 0 and first - l <= GAP) or (denials == 0 and now - l <= GAP))
  local value
  if running then
    if denials > 0 then
      if first < since then since = first end
      if last > l then l = last end
    end
    value = string.format('%d,%d,%d,%d', since, l, c + checks, d + denials)
  elseif denials > 0 then
    value = string.format('%d,%d,%d,%d', first, last, checks, denials)
  end
  -- else: checks after a streak ended count for nothing
  if value then
    redis.call('HSET', KEYS[1], id, value)
    touched = true
  end
end
if touched then redis.call('PEXPIRE', KEYS[1], 7200000) end
return 1
