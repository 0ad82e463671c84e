-- check.lua: one check of a policy, every rule × identifier at once, all or nothing.
-- Appended after prelude.lua and the algorithm files; this is the part that reads KEYS/ARGV.
--
-- KEYS: one state key per entry (rule × identifier), all in one hash-tag slot on a cluster.
-- ARGV: [1] '' to use Redis TIME (the server's clock), or now in µs, or '+<µs>' for TIME
--           plus an offset (tests: a clock that never runs slower than Redis's);
--       [2] cost, an integer ≥ 0 (0 peeks: nothing is written);
--       [3] mode: 'check' (the normal all-or-nothing check), 'denied' (another slot of the
--           same check denied: act as if an entry here had denied), or 'refund' (give back
--           what a 'check' at now = ARGV[1] consumed; replies as a peek);
--       then 5 per entry, in KEYS order: algorithm code ("fw", "sl", "sw", "tb", "lb", "gc",
--       "bw"), count_denied ("1"|"0"), and the algorithm's three parameters (see its file).
-- Reply: { allowed (1|0), now_us, then per entry: allowed, limit, remaining, reset_ms,
--          retry_ms (-1 = none), delay_ms }
--
-- Each entry is evaluated first without writing. Only when every entry allows does each
-- commit its new state; when any denies, only entries with count_denied write, and entries
-- that would have allowed report their state unchanged (a peek at cost 0).
local n = #KEYS
assert(n > 0 and #ARGV == 3 + 5 * n, 'check.lua: expected 3 + 5 ARGV per key')

local now
if ARGV[1] == '' or string.sub(ARGV[1], 1, 1) == '+' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + (tonumber(string.sub(ARGV[1], 2)) or 0)
else
  now = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])
assert(now and cost and cost >= 0 and cost == math.floor(cost), 'check.lua: bad now or cost')
local mode = ARGV[3]
assert(mode == 'check' or mode == 'denied' or mode == 'refund', 'check.lua: bad mode')

local entries = {}
local all_allowed = true
for i = 1, n do
  local base = 3 + (i - 1) * 5
  local e = {
    step = ALGORITHMS[ARGV[base + 1]],
    refund = REFUNDS[ARGV[base + 1]],
    count_denied = ARGV[base + 2] == '1',
    p1 = tonumber(ARGV[base + 3]), p2 = tonumber(ARGV[base + 4]), p3 = tonumber(ARGV[base + 5]),
  }
  assert(e.step, 'check.lua: unknown algorithm ' .. tostring(ARGV[base + 1]))
  if mode == 'refund' then
    e.refund(KEYS[i], now, cost, e.p1, e.p2, e.p3)
    e.result = e.step(KEYS[i], now, 0, e.p1, e.p2, e.p3, false)
  else
    e.result, e.commit = e.step(KEYS[i], now, cost, e.p1, e.p2, e.p3, e.count_denied)
  end
  if e.result[1] == 0 then all_allowed = false end
  entries[i] = e
end

if mode ~= 'check' then all_allowed = false end
local reply = { all_allowed and 1 or 0, now }
for i = 1, n do
  local e = entries[i]
  if mode == 'refund' then
    -- already given back; the result is a peek
  elseif all_allowed or e.count_denied then
    if e.commit then e.commit() end
  elseif e.result[1] == 1 then
    e.result = e.step(KEYS[i], now, 0, e.p1, e.p2, e.p3, false)
  end
  for j = 1, 6 do reply[#reply + 1] = e.result[j] end
end
return reply
