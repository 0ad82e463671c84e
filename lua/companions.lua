-- companions.lua: the identifiers each identifier was checked together with (user=bob with
-- ip=203.0.113.11), so the inspector can say that bob was denied through his address.
-- Written by each instance from the checks it answered, at most once per pair per ten
-- minutes (service::live), off the check path.
--
-- KEYS: [1] the companions hash of the current ten minutes (field: an identifier
--       '<dimension>=<value>'; value: its companions, newest first, joined by newlines)
-- ARGV: pairs (identifier, new companions joined by newlines)
-- Reply: 1
--
-- An identifier keeps at most 16 companions a ten minutes: a shared address seen with a
-- thousand users is worth naming, not listing. TTL 70 minutes: the last hour is read.
assert(#KEYS == 1 and #ARGV % 2 == 0, 'companions.lua: 1 KEY and 2n ARGV')
for j = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[j]) or ''
  local out, seen = {}, {}
  for c in string.gmatch(ARGV[j + 1] .. '\n' .. old, '[^\n]+') do
    if not seen[c] and #out < 16 then
      seen[c] = true
      out[#out + 1] = c
    end
  end
  redis.call('HSET', KEYS[1], ARGV[j], table.concat(out, '\n'))
end
redis.call('PEXPIRE', KEYS[1], 4200000)
return 1
