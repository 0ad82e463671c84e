-- stats_detail.lua: what the overview's "Throttled now" tells of a denial beyond its count
-- (the rule that bound, the first and last denial, until when, and every identifier of the
-- denied check), and each policy's own list of the most denied. Written by each instance
-- once a second from the denials it answered (service::live), off the check path.
--
-- KEYS: [1] the policy's denial details of the current minute (hash, field: the identifier
--       that bound, '<dimension>=<value>'; value: 'first_ms,last_ms,until_ms,rule' then,
--       after a newline each, the check's identifiers), [2] the policy's denied sorted set
--       of the current minute (member: the identifier, score: denials)
-- ARGV: 7 per denial: identifier, denials, first ms, last ms, blocked-until ms (0: no known
--       end), rule, the check's identifiers joined by newlines
-- Reply: 1
--
-- Two instances flush the same identifier in any order: the earliest first denial stays,
-- and the rest comes from whichever saw the later last denial. TTL 6 minutes, as the
-- global denied sets of stats.lua.
assert(#KEYS == 2 and #ARGV % 7 == 0, 'stats_detail.lua: 2 KEYS and 7n ARGV')
for b = 1, #ARGV, 7 do
  local id, first, last = ARGV[b], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local value = ARGV[b + 3] .. ',' .. ARGV[b + 4] .. ',' .. ARGV[b + 5] .. '\n' .. ARGV[b + 6]
  local old = redis.call('HGET', KEYS[1], id)
  if old then
    local f, l, rest = string.match(old, '^(%d+),(%d+)(,.*)$')
    f, l = tonumber(f), tonumber(l)
    if f and f < first then first = f end
    if l and l > last then value = l .. rest end
  end
  redis.call('HSET', KEYS[1], id, string.format('%d', first) .. ',' .. value)
  redis.call('ZINCRBY', KEYS[2], ARGV[b + 1], id)
end
redis.call('PEXPIRE', KEYS[1], 360000)
redis.call('PEXPIRE', KEYS[2], 360000)
return 1
