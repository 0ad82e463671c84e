-- check.lua: checks of policies, every rule × identifier of a check at once, all or nothing.
-- Appended after prelude.lua, the algorithm files and stats.lua; this is the part that reads
-- KEYS/ARGV. Two call shapes:
--
-- One check (modes 'check', 'denied', 'refund', 'probe'; no live counters):
--   KEYS: one state key per entry (rule × identifier), then the penalty key of each entry
--         whose rule has a penalty box (see `held` below), all in one hash-tag slot on a
--         cluster.
--   ARGV: [1] '' to use Redis TIME (the server's clock), or now in µs, or '+<µs>' for TIME
--             plus an offset (tests: a clock that never runs slower than Redis's);
--         [2] cost, an integer ≥ 0 (0 peeks: nothing is written);
--         [3] mode: 'check' (the normal all-or-nothing check), 'denied' (another slot of the
--             same check denied: act as if an entry here had denied), 'refund' (give back
--             what a 'check' at now = ARGV[1] consumed; replies as a peek), or 'probe'
--             (writes nothing: each entry's state as a peek, with retry_ms saying when a
--             request of `cost` would pass it; the inspector's "next request in"),
--             'report' (usage known after the fact: each entry counts `cost` as a counted
--             denial would, even past its limit, so the next check is denied) or 'giveback'
--             (a negative report: each entry gives `cost` back, never below nothing; see
--             GIVEBACKS in prelude.lua); both reply as a peek and leave leases alone;
--             'flush:<since µs>' (a local rule's flush: a 'report', unless the identifier
--             was reset at or after `since`, when its counter was seeded; then nothing is
--             counted and the reply's first integer is 2; the epoch key reset.lua writes is
--             the last of KEYS);
--         then 5 per entry, in KEYS order: algorithm code ("fw", "lw", "sw", "tb", "lb",
--         "gc", "bw", "cc", "qt"), count_denied ("1"|"0", followed by ":<cost>" when the
--         entry has a cost of its own, which it is counted at instead of ARGV[2], then by
--         "!<block_ms>@<offset>" when its rule has a penalty box: its penalty key is
--         KEYS[<the check's first key> - 1 + offset], see `held` below), and the
--         algorithm's three
--         parameters (see its file; numbers, but for a quota's boundaries).
--   Reply: { allowed (1|0), now_us, then per entry: allowed (1, 0, or 2: denied by the
--            rule's penalty box), limit, remaining, reset_ms, retry_ms (-1 = none),
--            delay_ms }
--
-- A batch of counted checks (mode 'batch', single Redis: the checks that arrived together,
-- coalesced into one call; each is its own all-or-nothing check, evaluated in order, so a
-- later check sees what an earlier one consumed, exactly as if they had come one by one):
--   KEYS: per check, its n state keys, its p penalty keys, then its policy's rate hash (see
--         stats.lua); last, the denied set and the near set of the current minute.
--   ARGV: [1] the clock, as above; [2] m, the number of checks; [3] 'batch'; then per check:
--         n (or 'n:p' when it has p penalty keys), cost, 5 per entry as above, then one
--         label per entry
--         ('<policy>|<dimension>=<value>').
--   Reply: one string, the integers { now_us, then per check: allowed (1|0, or -1 when the
--          check's script failed), then 6 per entry as above (zeros for a failed check) }
--          joined by ','; then, only when checks failed, one line per failure after a
--          newline: '<index from 0>:<error>'. A failed check is not counted in the live
--          counters and fails no other check of the batch. (Writes its entries made before
--          the failure stay: no validated rule and cost fails a script, so this is for
--          state someone else broke, such as a key of the wrong type, which fails on read,
--          before anything is written.) One string rather than an array of integers: a client
--          reads it in one piece, where parsing a hundred RESP integers costs it more than
--          the check. Lua writes numbers with up to 14 significant digits (now_us, the only
--          longer one, is written whole), and fractions as they are (the client truncates,
--          as Redis does when it turns a Lua number into an integer).
--          Each distinct number is turned into text once per call: Lua 5.1 formats a number
--          with sprintf, which was a fifth of the script's time (8.4 against 7.3 µs a check,
--          redis-benchmark, 16 checks a call), and most numbers of a batch repeat (flags,
--          limits, the window's reset).
--   Live counters: each check is counted allowed or denied under its policy; a denial is
--   charged to the label of the entry that bound (longest retry); an allowed check whose
--   tightest entry used 80 % or more of its limit is noted as near. Counts are summed over
--   the batch first, so m checks of one policy are one HINCRBY.
--
-- Each entry is evaluated first without writing. Only when every entry of its check allows
-- does each write its new state; when any denies, only entries with count_denied write, and
-- entries that would have allowed report their state unchanged (a peek at cost 0).
local mode = ARGV[3]

local now
if ARGV[1] == '' or string.sub(ARGV[1], 1, 1) == '+' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + (tonumber(string.sub(ARGV[1], 2)) or 0)
else
  now = tonumber(ARGV[1])
end
assert(now, 'check.lua: bad now')

-- One check of the n entries whose keys follow KEYS[k] and whose arguments follow ARGV[a].
-- Returns whether it allowed, and each entry's result in `results` (1..n), a table of the
-- call's that the next check reuses: read it before running another. The entries' writes
-- wait in `writes`, reused the same way. A table grown anew for every check was rehashed
-- at each power of two (36 slots for 6 entries): 4-5 % of a 3 rules x 2 identifiers check
-- in Redis (batches of 8 replayed, 8 interleaved runs: 36.1 -> 34.7 µs a check).
local results, writes = {}, {}

-- An entry's count_denied flag ('1' or '0'), its cost and its penalty: its own cost when
-- the flag carries one ('1:60': an Envoy descriptor's hits), else the check's; its rule's
-- block_ms after a '!', with where its penalty key is after an '@' (the offset from the
-- check's first key: '0!60000@3' is KEYS[k + 3]), else 0 and nil.
local function counting(flag, cost)
  local count_denied = string.byte(flag, 1) == 49
  if #flag == 1 then return count_denied, cost, 0, nil end
  local own, block, at = match(flag, '^[01]:?(%d*)!?(%d*)@?(%d*)$')
  assert(own, 'check.lua: bad entry flag')
  if own ~= '' then cost = tonumber(own) end
  assert(cost and cost >= 0 and cost == floor(cost), 'check.lua: bad entry cost')
  block = tonumber(block) or 0
  at = tonumber(at)
  assert(block == 0 or at, 'check.lua: a penalty without its key')
  return count_denied, cost, block, at
end

-- The penalty box (a rule's block_ms). Once the rule denies an identifier, its penalty key
-- (in KEYS after the check's state keys, in their slot; `store::keys::penalty_box` names
-- it) holds until when (µs) the entry keeps denying, whatever its state says. An entry held is not stepped: its result is its state
-- as a peek, denied with allowed = 2 (a penalty), nothing left, and retry_ms the rest of
-- the penalty. A denial of the entry's own, at a cost, starts a penalty and answers the
-- same way, its retry at least block_ms. domain::check::evaluate mirrors this.
local function held_until(pkey, now)
  local until_us = tonumber(redis.call('GET', pkey))
  if until_us and until_us > now then return until_us end
  return nil
end

local function held(result, now, until_us)
  local wait = ceil_ms(until_us - now)
  result[1], result[3], result[5], result[6] = 2, 0, wait, 0
  if result[4] < wait then result[4] = wait end
  return result
end

local function trip(pkey, result, now, block_ms)
  redis.call('SET', pkey, int(now + block_ms * 1000), 'PX', block_ms + 1)
  result[1], result[3] = 2, 0
  if result[4] < block_ms then result[4] = block_ms end
  if result[5] ~= -1 and result[5] < block_ms then result[5] = block_ms end
  return result
end

local function run(k, a, n, cost, mode)
  assert(cost and cost >= 0 and cost == floor(cost), 'check.lua: bad cost')
  if n == 1 and mode == 'check' and not string.find(ARGV[a + 2], '!', 2, true) then
    -- One entry (most checks): the same steps without the bookkeeping of several (nor a
    -- penalty box).
    local step = ALGORITHMS[ARGV[a + 1]]
    if not step then error('check.lua: unknown algorithm ' .. tostring(ARGV[a + 1])) end
    local key = KEYS[k + 1]
    local count_denied, c = counting(ARGV[a + 2], cost)
    local result, write, w1, w2, w3, w4, w5 = step(key, now, c, param(ARGV[a + 3]),
      param(ARGV[a + 4]), param(ARGV[a + 5]), count_denied)
    local allowed = result[1] == 1
    if write and (allowed or count_denied) then write(key, w1, w2, w3, w4, w5) end
    results[1] = result
    return allowed, results
  end
  -- Each entry's result, and its write (the function, then its five arguments) in `writes`;
  -- every slot up to 6 * n is assigned below before it is read.
  local all_allowed = true
  for i = 1, n do
    local base = a + (i - 1) * 5
    local key = KEYS[k + i]
    local code = ARGV[base + 1]
    local step = ALGORITHMS[code]
    if not step then error('check.lua: unknown algorithm ' .. tostring(code)) end
    local p1, p2, p3 = param(ARGV[base + 3]), param(ARGV[base + 4]), param(ARGV[base + 5])
    local count_denied, c, block, at = counting(ARGV[base + 2], cost)
    local pkey = at and KEYS[k + at]
    local result
    local until_us = block > 0 and (mode == 'check' or mode == 'denied' or mode == 'probe')
      and held_until(pkey, now)
    if until_us then
      -- held by its penalty: nothing is stepped, nothing written
      result = held(step(key, now, 0, p1, p2, p3, false), now, until_us)
      writes[6 * i - 5] = nil
    elseif mode == 'refund' then
      REFUNDS[code](key, now, c, p1, p2, p3)
      result = step(key, now, 0, p1, p2, p3, false)
    elseif mode == 'report' or mode == 'giveback' then
      -- Usage known after the fact; leases are released, not reported.
      if code ~= 'cc' and c > 0 then
        if mode == 'report' then
          local _, write, w1, w2, w3, w4, w5 = step(key, now, c, p1, p2, p3, true)
          if write then write(key, w1, w2, w3, w4, w5) end
        else
          (GIVEBACKS[code] or REFUNDS[code])(key, now, c, p1, p2, p3)
        end
      end
      result = step(key, now, 0, p1, p2, p3, false)
    elseif mode == 'probe' then
      local at_cost = step(key, now, c, p1, p2, p3, false)
      result = step(key, now, 0, p1, p2, p3, false)
      result[5] = at_cost[5]
    else
      local w = 6 * i
      result, writes[w - 5], writes[w - 4], writes[w - 3], writes[w - 2], writes[w - 1],
        writes[w] = step(key, now, c, p1, p2, p3, count_denied)
      if block > 0 and result[1] == 0 and c > 0 then result = trip(pkey, result, now, block) end
    end
    if result[1] ~= 1 then all_allowed = false end
    results[i] = result
  end
  if mode ~= 'check' then all_allowed = false end
  if mode == 'check' or mode == 'denied' then
    for i = 1, n do
      local base = a + (i - 1) * 5
      local w = 6 * i
      if all_allowed or string.byte(ARGV[base + 2], 1) == 49 then
        local write = writes[w - 5]
        if write then
          write(KEYS[k + i], writes[w - 4], writes[w - 3], writes[w - 2], writes[w - 1], writes[w])
        end
      elseif results[i][1] == 1 then
        results[i] = ALGORITHMS[ARGV[base + 1]](KEYS[k + i], now, 0, param(ARGV[base + 3]),
          param(ARGV[base + 4]), param(ARGV[base + 5]), false)
      end
    end
  end
  return all_allowed, results
end

if mode ~= 'batch' then
  -- n state keys, then the penalty keys of the entries with one
  local n = (#ARGV - 3) / 5
  assert(n > 0 and n == floor(n) and #KEYS >= n, 'check.lua: expected 3 + 5 ARGV per entry')
  local cost, discarded = tonumber(ARGV[2]), false
  if string.sub(mode, 1, 6) == 'flush:' then
    local since = tonumber(string.sub(mode, 7))
    assert(since and #KEYS > n, 'check.lua: a flush names its since and its epoch key')
    local reset_at = redis.call('GET', KEYS[#KEYS])
    mode = 'report'
    if reset_at and tonumber(reset_at) >= since then cost, discarded = 0, true end
  end
  assert(mode == 'check' or mode == 'denied' or mode == 'refund' or mode == 'probe'
    or mode == 'report' or mode == 'giveback', 'check.lua: bad mode')
  local allowed, results = run(0, 3, n, cost, mode)
  local reply = { discarded and 2 or (allowed and 1 or 0), now }
  for i = 1, n do
    for j = 1, 6 do reply[#reply + 1] = results[i][j] end
  end
  return reply
end

local m = tonumber(ARGV[2])
assert(m and m > 0, 'check.lua: bad number of checks')
-- A check's number of entries, and of penalty keys after its state keys: 'n', or 'n:p'
-- when some of its rules have a penalty box.
local function entries(x)
  local n = tonumber(x)
  if n then return n, 0 end
  local a, b = match(x, '^(%d+):(%d+)$')
  return tonumber(a), tonumber(b) or 0
end
-- The totals checked before anything is written (the loop below works out where each
-- check's keys and arguments start as it goes; a table of them cost 3 % of a 1-rule check).
do
  local k, a = 0, 3
  for c = 1, m do
    local n, p = entries(ARGV[a + 1])
    assert(n and n > 0, 'check.lua: bad number of entries')
    k = k + n + p + 1
    a = a + 2 + 6 * n
  end
  assert(k + 2 == #KEYS and a == #ARGV, 'check.lua: batch KEYS or ARGV do not add up')
end
local denied_key, near_key = KEYS[#KEYS - 1], KEYS[#KEYS]
-- Live counters summed over the batch, in first-seen order: per rate hash, allowed and
-- denied; per label, denials; per label, the last near-limit percentage. The last two (and
-- `failures`) are made on first use: most batches have no denial and no check near its limit.
local rates, rate_order = {}, {}
local denials, denial_order
local near, near_order
local reply = { now }
local texts = {}
-- `x` as tostring (and table.concat) would write it, formatted once; but -0 is written 0
-- (both read as 0; -0 and 0 are one key of `texts`, so tostring's '-0' would have stood
-- for every later 0 of the reply).
local function text(x)
  local t = texts[x]
  if t == nil then
    if x == floor(x) and x > -1e14 and x < 1e14 then
      -- A whole number of up to 14 digits: the same text, without sprintf's float path.
      t = format('%d', x)
    else
      t = tostring(x)
    end
    if x == x then texts[x] = t end -- NaN cannot be a key (and the client rejects it)
  end
  return t
end
-- Checks whose script failed: each answers '-1' and its message follows the reply.
local failures
local r = 1
local k, a = 0, 3
for c = 1, m do
  local n, p = entries(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  a = a + 2
  -- One check failing (a key of the wrong type, say) fails that check alone: the others
  -- of the batch never depend on it, so they are still answered.
  local ok, allowed, results = pcall(run, k, a, n, cost, 'check')
  if not ok then
    local message = allowed
    if type(message) == 'table' then message = message.err end
    message = string.gsub(tostring(message), '[\r\n]', ' ')
    failures = failures or {}
    failures[#failures + 1] = (c - 1) .. ':' .. message
    r = r + 1
    reply[r] = '-1'
    for j = 1, 6 * n do reply[r + j] = '0' end
    r = r + 6 * n
  else
    r = r + 1
    reply[r] = allowed and '1' or '0'
    for i = 1, n do
      local result = results[i]
      for j = 1, 6 do
        -- the memo read here, `text` called only for a number not seen yet this call
        local x = result[j]
        reply[r + j] = texts[x] or text(x)
      end
      r = r + 6
    end

    local labels = a + 5 * n
    local rate = KEYS[k + n + p + 1]
    local tally = rates[rate]
    if not tally then
      tally = { 0, 0 }
      rates[rate] = tally
      rate_order[#rate_order + 1] = rate
    end
    if allowed then
      tally[1] = tally[1] + 1
      -- the tightest entry at 80 % of its limit used or more (which leaves a fifth at most:
      -- only those are divided), highest share first
      local best, best_pct = nil, -1
      for i = 1, n do
        local r = results[i]
        if r[2] > 0 and r[3] * 5 <= r[2] then
          local pct = floor((r[2] - r[3]) * 100 / r[2])
          if pct > best_pct then best, best_pct = i, pct end
        end
      end
      if best then
        local label = ARGV[labels + best]
        if not near then near, near_order = {}, {} end
        if not near[label] then near_order[#near_order + 1] = label end
        near[label] = best_pct
      end
    else
      tally[2] = tally[2] + 1
      -- the entry that bound: a denial that makes the caller wait longest (-1 = never)
      local bind, wait = nil, -2
      for i = 1, n do
        local r = results[i]
        if r[1] ~= 1 then
          local w = r[5] == -1 and math.huge or r[5]
          if w > wait then bind, wait = i, w end
        end
      end
      if bind then
        local label = ARGV[labels + bind]
        if not denials then denials, denial_order = {}, {} end
        if not denials[label] then
          denials[label] = 0
          denial_order[#denial_order + 1] = label
        end
        denials[label] = denials[label] + 1
      end
    end
  end
  k = k + n + p + 1
  a = a + 6 * n
end

local sec = floor(now / 1000000)
for _, rate in ipairs(rate_order) do
  stats_count(rate, sec, rates[rate][1], rates[rate][2])
end
if denial_order then
  for _, label in ipairs(denial_order) do
    stats_denied(denied_key, label, denials[label])
  end
end
if near_order then
  for _, label in ipairs(near_order) do
    stats_near(near_key, label, near[label])
  end
end
reply[1] = format('%d', now)
local answer = table.concat(reply, ',')
if failures then answer = answer .. '\n' .. table.concat(failures, '\n') end
return answer
