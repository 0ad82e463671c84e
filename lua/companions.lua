-- companions.lua: the identifiers each identifier was checked together with (user=bob with
-- ip=203.0.113.11), so the inspector can say that bob was denied through his address.
-- Written by each instance from the checks it answered, at most once per pair per ten
-- minutes (service::live), off the check path.
--
-- KEYS: [1] the companions hash of the current ten minutes (field: an identifier
--       '<dimension>=<value>'; value: its companions, newest first, joined by newlines)
-- ARGV: pairs (identifier, new companions joined by newlines)
-- Reply: pairs (identifier, every companion of this call and its list, joined by newlines)
--        of the identifiers with more companions than the list keeps: shared ones, whose
--        companions the caller counts apart (a HyperLogLog a ten minutes, store/stats.rs).
--
-- An identifier keeps at most 16 companions a ten minutes: a shared address seen with a
-- thousand users is worth naming and counting, not listing. TTL 70 minutes: the last hour
-- is read.
assert(#KEYS == 1 and #ARGV % 2 == 0, 'companions.lua: 1 KEY and 2n ARGV')
local shared = {}
for j = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[j]) or ''
  local out, seen, all = {}, {}, {}
  for c in string.gmatch(ARGV[j + 1] .. '\n' .. old, '[^\n]+') do
    if not seen[c] then
      seen[c] = true
      all[#all + 1] = c
      if #out < 16 then out[#out + 1] = c end
    end
  end
  redis.call('HSET', KEYS[1], ARGV[j], table.concat(out, '\n'))
  if #all > 16 then
    shared[#shared + 1] = ARGV[j]
    shared[#shared + 1] = table.concat(all, '\n')
  end
end
redis.call('PEXPIRE', KEYS[1], 4200000)
return shared
