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
-- Live counters (see stats.lua): with mode 'check+stats' (a 'check' that is also counted),
-- KEYS has 3 more keys after the state keys (rate hash, denied set, near set) and ARGV one
-- label per entry after the entries ('<policy>|<dimension>=<value>'); the check is counted allowed or
-- denied, a denial is charged to the label of the entry that bound (longest retry), and an
-- allowed check whose tightest entry used 80 % or more of its limit is noted as near.
--
-- Each entry is evaluated first without writing. Only when every entry allows does each
-- commit its new state; when any denies, only entries with count_denied write, and entries
-- that would have allowed report their state unchanged (a peek at cost 0).
local n = #KEYS
local with_stats = ARGV[3] == 'check+stats'
if with_stats then
  -- KEYS = n entries + 3 stats keys, ARGV = 3 + 5n + n labels
  n = n - 3
  assert(n > 0 and #ARGV == 3 + 6 * n, 'check.lua: expected 3 + 6 ARGV per entry and 3 stats keys')
else
  assert(n > 0 and #ARGV == 3 + 5 * n, 'check.lua: expected 3 + 5 ARGV per key')
end

local now
if ARGV[1] == '' or string.sub(ARGV[1], 1, 1) == '+' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + (tonumber(string.sub(ARGV[1], 2)) or 0)
else
  now = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])
assert(now and cost and cost >= 0 and cost == math.floor(cost), 'check.lua: bad now or cost')
local mode = with_stats and 'check' or ARGV[3]
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

if with_stats and mode == 'check' then
  local labels = 3 + 5 * n
  local sec = math.floor(now / 1000000)
  if all_allowed then
    stats_count(KEYS[n + 1], sec, 1, 0)
    -- the tightest entry: highest share of its limit used
    local best, best_pct = nil, -1
    for i = 1, n do
      local r = entries[i].result
      if r[2] > 0 then
        local pct = math.floor((r[2] - r[3]) * 100 / r[2])
        if pct > best_pct then best, best_pct = i, pct end
      end
    end
    if best and best_pct >= 80 then stats_near(KEYS[n + 3], ARGV[labels + best], best_pct) end
  else
    stats_count(KEYS[n + 1], sec, 0, 1)
    -- the entry that bound: a denial that makes the caller wait longest (-1 = never)
    local bind, wait = nil, -2
    for i = 1, n do
      local r = entries[i].result
      if r[1] == 0 then
        local w = r[5] == -1 and math.huge or r[5]
        if w > wait then bind, wait = i, w end
      end
    end
    if bind then stats_denied(KEYS[n + 2], ARGV[labels + bind], 1) end
  end
end
return reply
