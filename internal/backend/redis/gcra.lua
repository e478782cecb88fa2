-- GCRA and the window algorithms for rls: backend.DecideBatch (internal/backend) in one atomic
-- call.
--
-- Time is integer microseconds from Redis TIME, so every replica of rls agrees on it. A TAT is
-- exact: us + frac/rate microseconds with 0 <= frac < rate. A key stores its state as four
-- little-endian doubles (tat_us, frac, rate, period_us: 32 bytes) with an expiry at its reset,
-- when it holds no usage any more. Every value is an integer below 2^53, so exact as a double,
-- and struct.pack/unpack cost a tenth of formatting and parsing text.
--
-- Lua numbers here are doubles: integers are exact only below 2^53. The bounds that keep every
-- intermediate below 2^53, given limits that backend.Limit.Validate accepts (rate and burst
-- <= 2^32, period and burst*period/rate <= 100 years = 3.16e15 us < 2^52):
--   * interval(n) = n*period/rate never forms n*period (up to 2^84): period is split into
--     pq*rate + pr, and when n*pr reaches 2^53, n into 16-bit halves, so that no product
--     exceeds 2^49;
--   * count(d) = floor(d/T) is exact when d*rate fits 2^53; otherwise it is estimated in
--     floating point, off by at most one since the result is below 2^34, and corrected with
--     exact comparisons;
--   * divmod corrects a float quotient that rounded to the next integer (possible only for
--     a dividend near 2^53, which the bounds above never reach; kept as a guard).
--
-- The wire format (encoded and decoded in wire.go; TestWireFormat pins it):
-- ARGV[1] is the operation, ARGV[2] the instant (0: Redis TIME; tests pass a fixed one).
--   "d" decide one batch: ARGV[3] when to refuse the batch for its quota requests (k > 0: when
--       k quota requests here are denied, which are then every quota request of the batch not
--       already denied; 0: never; -1: refused already), ARGV[4] "1" when other script calls
--       hold part of the batch (Cluster slots), ARGV[5] per key: rate, period (us), burst, cost
--       (clamped to [0, burst+1], or under overdraft to [0, Limit.MaxCharge]), flags (1 refund,
--       + 2*mode with mode 0 enforce, 1 shadow, 2 quota, + 8 overdraft), as little-endian
--       doubles, then the window: offset, 0, 0 for Period-long windows, or for calendar windows
--       the start and end of the window holding rls's instant and the end of the next one: the
--       script decides in the window before, that one or the next, whichever holds its now.
--       flags add 16*algorithm (0 gcra, 1 fixed_window, 2 sliding_window, 3 sliding_log).
--       Rate is > 0: rls decides rate 0 itself.
--       Replies with one string of doubles: charged (1/0), then per key allowed, remaining,
--       retry_us, reset_us; with ARGV[4] = "1" also, per key, the check-only remaining and
--       reset_us (what the key reports once the batch is undone) and the exact change written
--       (delta_us, delta_frac in 1/rate us; zero but on a key's last occurrence), then m and m
--       pairs: under sliding_log the entries a refund took hits from (instant, hits), else 0.
--   "m" several batches, each decided as by "d" with ARGV[4] = "0", in order, as one call each
--       would: ARGV[3], ARGV[4] are the first batch's threshold and values, ARGV[5], ARGV[6] the
--       second's, and so on; KEYS are the batches' keys in order. Replies with the replies of
--       "d", concatenated. This pays the fixed cost of a script call (and TIME) once for many
--       concurrent calls.
--   "u" undo: ARGV[3] per key: rate, period, burst, delta_us, delta_frac, overdraft (1/0) +
--       2*algorithm, m, then m pairs, as "d" replied them: subtracts a change that "d" wrote
--       (for a batch another slot refused), within [now, now + burst], or under overdraft
--       [now, now + MAX_TOLERANCE]. Under the window algorithms the change is (hits, the end of
--       their window) or, under sliding_log, (hits, their instant) and the entries to give back.
--       Replies with the empty string.

-- The window algorithms (backend/window.go) store their state as doubles too: fixed_window
-- and sliding_window (algorithm, window end, count, previous count, rate, period: 48 bytes),
-- sliding_log (3, rate, period, entries, hits before the first entry, then per entry its instant
-- and the hits admitted up to it, cumulative: 40 + 16 bytes per entry). The first double tells
-- the forms apart: a GCRA TAT is never 1, 2 or 3.
--
-- Overdraft (see backend.Decide): a denied charge of cost > 0 under an overdraft limit is
-- written anyway, its TAT saturating at now + MAX_TOLERANCE, and never refuses its batch. With
-- that bound every TAT stays below now + 2*MAX_TOLERANCE < 2^53 (until the year 2055).

local MAX_TOLERANCE = 100 * 365 * 24 * 3600 * 1000000
local TWO53 = 9007199254740992
-- The library functions used most, bound on the first call (see run): a library of Redis
-- Functions is loaded in an environment that has none of them.
local floor, unpack_list, pack, call
local function bind()
  floor, unpack_list, pack, call = math.floor, unpack, struct.pack, redis.call
end
local unpack
local fixed_now = false

-- divmod returns floor(a/b) and a mod b for integers 0 <= a < 2^53, 0 < b < 2^53.
local function divmod(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

local function less(aus, af, bus, bf)
  return aus < bus or (aus == bus and af < bf)
end

local function add(aus, af, bus, bf, rate)
  local us, f = aus + bus, af + bf
  if f >= rate then
    f, us = f - rate, us + 1
  end
  return us, f
end

local function sub(aus, af, bus, bf, rate)
  local us, f = aus - bus, af - bf
  if f < 0 then
    f, us = f + rate, us - 1
  end
  return us, f
end

-- interval returns n emission intervals, n*period/rate, exactly as (us, frac), 0 <= n < 2^34.
local function interval(n, L)
  local rate, pr = L[1], L[5]
  local q, r
  local m = n * pr
  if m < TWO53 then
    q, r = divmod(m, rate)
  else
    local nh = floor(n / 65536)
    local a, b = divmod(nh * pr, rate)
    local c
    c, r = divmod(b * 65536 + (n - nh * 65536) * pr, rate)
    q = a * 65536 + c
  end
  return n * L[4] + q, r
end

-- limit is a limit with what every decision under it needs: {rate, period, burst, pq, pr,
-- full_us, full_frac, one_us, one_frac, overdraft, most_us, most_frac}, where period =
-- pq*rate + pr, so that one emission interval is (pq, pr), a full burst is (full_us,
-- full_frac), the cost of one request (one_us, one_frac) and the most a state may hold
-- (most_us, most_frac): a full burst, or under overdraft MAX_TOLERANCE.
local function limit(rate, period, burst, overdraft)
  local pq, pr = divmod(period, rate)
  local L = {rate, period, burst, pq, pr, 0, 0, 0, 0, overdraft, 0, 0}
  L[6], L[7] = interval(burst, L)
  L[8], L[9] = interval(1, L)
  if overdraft then
    L[11] = MAX_TOLERANCE
  else
    L[11], L[12] = L[6], L[7]
  end
  return L
end

-- count returns floor(d/T) for a span d >= 0 of fewer than 2^34 emission intervals.
local function count(dus, df, L)
  local x = dus * L[1] + df
  if x < TWO53 then
    if x < 0 then
      return 0
    end
    return (divmod(x, L[2]))
  end
  local n = floor(x / L[2])
  local ius, ifr = interval(n, L)
  if less(dus, df, ius, ifr) then
    return n - 1
  end
  ius, ifr = add(ius, ifr, L[4], L[5], L[1])
  if less(dus, df, ius, ifr) then
    return n
  end
  return n + 1
end

local function ceil_us(us, f)
  if f > 0 then
    us = us + 1
  end
  if us < 0 then
    us = 0
  end
  return us
end

-- A state is a table {tat_us, tat_frac, rate, period}, or false for none.
local function fresh(s, now)
  return not s or s[5] ~= nil or s[1] < now or (s[1] == now and s[2] == 0)
end

-- current returns the TAT of s under L at now, as gcra.go's current: never before now, a state
-- written under another limit keeps the requests it holds (rounded up), capped at a full burst.
local function current(s, L, now)
  if fresh(s, now) then
    return now, 0
  end
  local rate = L[1]
  local hus, hf
  if s[3] == rate and s[4] == L[2] then
    hus, hf = sub(s[1], s[2], now, 0, rate)
  else
    local orate, operiod = s[3], s[4]
    if orate <= 0 or operiod <= 0 or s[2] < 0 or s[2] >= orate or s[1] - now > MAX_TOLERANCE then
      return now, 0 -- not a state rls wrote
    end
    local dus, df = sub(s[1], s[2], now, 0, orate)
    local n
    if dus * orate / operiod > 8589934592 then
      n = L[3] -- more than 2^33 intervals (a debt): more than any burst
    else
      local O = limit(orate, operiod, 1, false)
      n = count(dus, df, O)
      local ius, ifr = interval(n, O)
      if less(ius, ifr, dus, df) then
        n = n + 1
      end
    end
    if n > L[3] then
      n = L[3]
    end
    hus, hf = interval(n, L)
  end
  if less(L[11], L[12], hus, hf) then
    hus, hf = L[11], L[12]
  end
  return add(now, 0, hus, hf, rate)
end

-- overdrawn is gcra.go's overdrawn: the state after a denied charge of cost > 0 under overdraft
-- on the TAT (tus, tf), the TAT plus the cost, saturated at now + MAX_TOLERANCE.
local function overdrawn(L, now, tus, tf, cost)
  local rate = L[1]
  local rus, rf = sub(now + MAX_TOLERANCE, 0, tus, tf, rate)
  local cus, cf = interval(cost, L)
  if less(rus, rf, cus, cf) then
    return {now + MAX_TOLERANCE, 0, rate, L[2]}
  end
  local nus, nf = add(tus, tf, cus, cf, rate)
  return {nus, nf, rate, L[2]}
end

-- debt is gcra.go's Decide for a denied charge under overdraft, charged all the same: the state
-- after it, and a decision describing that state: 0 remaining, retry once the debt is repaid,
-- reset once a full burst is back.
local function debt(L, now, tus, tf, cost)
  local rate = L[1]
  local ns = overdrawn(L, now, tus, tf, cost)
  local rus, rf = sub(ns[1], ns[2], L[6], L[7], rate)
  return ns, 0, 0, ceil_us(sub(rus, rf, now, 0, rate)), ceil_us(sub(ns[1], ns[2], now, 0, rate))
end

-- decide is gcra.go's Decide: the new state (s itself when denied) and the decision.
local function decide(s, L, now, cost)
  local rate = L[1]
  local tus, tf
  if not s or s[1] < now or (s[1] == now and s[2] == 0) then
    -- Fresh (as fresh() says, inlined): the key holds no usage, so a full burst remains and any
    -- cost within it is admitted. The common case, taken without the general arithmetic.
    if cost <= L[3] then
      local cus, cf
      if cost == 1 then
        cus, cf = L[8], L[9]
      else
        if cost < 0 then
          cost = 0
        end
        cus, cf = interval(cost, L)
      end
      return {now + cus, cf, rate, L[2]}, 1, L[3] - cost, 0, ceil_us(cus, cf)
    end
    tus, tf = now, 0
  else
    tus, tf = current(s, L, now)
  end
  local aus, af = add(now, 0, L[6], L[7], rate)
  local hus, hf = sub(aus, af, tus, tf, rate)
  local remaining = count(hus, hf, L)
  if cost < 0 then
    cost = 0
  end
  if cost > L[3] then
    if L[10] and cost > 0 then
      return debt(L, now, tus, tf, cost)
    end
    -- Never admitted: retry no sooner than a full burst after the key is back to one.
    local reset = ceil_us(sub(tus, tf, now, 0, rate))
    return s, 0, remaining, ceil_us(L[6], L[7]) + reset, reset
  end
  local cus, cf = interval(cost, L)
  local nus, nf = add(tus, tf, cus, cf, rate)
  local wus, wf = sub(nus, nf, L[6], L[7], rate)
  if less(now, 0, wus, wf) then
    if L[10] and cost > 0 then
      return debt(L, now, tus, tf, cost)
    end
    return s, 0, remaining, ceil_us(sub(wus, wf, now, 0, rate)), ceil_us(sub(tus, tf, now, 0, rate))
  end
  return {nus, nf, rate, L[2]}, 1, remaining - cost, 0, ceil_us(sub(nus, nf, now, 0, rate))
end

-- refund is gcra.go's Refund.
local function refund(s, L, now, cost)
  local rate = L[1]
  local tus, tf = current(s, L, now)
  if cost > L[3] then
    cost = L[3]
  end
  if cost > 0 then
    local cus, cf = interval(cost, L)
    tus, tf = sub(tus, tf, cus, cf, rate)
    if less(tus, tf, now, 0) then
      tus, tf = now, 0
    end
  end
  local aus, af = add(now, 0, L[6], L[7], rate)
  local hus, hf = sub(aus, af, tus, tf, rate)
  return {tus, tf, rate, L[2]}, 1, count(hus, hf, L), 0, ceil_us(sub(tus, tf, now, 0, rate))
end


-- The window algorithms, as backend/window.go. A state is {end or 0, count, rate, period, alg,
-- previous count, log}; a limit W is {rate, period, burst, alg = alg, start, end}, with W[10]
-- its overdraft as in a GCRA limit.
local MAX_WINDOW_CHARGE = 8589934592 -- 2^33
local MAX_WINDOW_COUNT = 1099511627776 -- 2^40

-- expiry returns the instant from which a window state holds no usage.
local function expiry(s)
  local alg = s[5]
  if alg == 1 then
    if s[2] > 0 then
      return s[1]
    end
  elseif alg == 2 then
    if s[2] > 0 then
      return s[1] + s[4]
    elseif s[6] > 0 then
      return s[1]
    end
  elseif alg == 3 then
    local L = s[7]
    if L.k >= 1 then
      return unpack("<d", L.e, 16 * L.k - 15) + s[4]
    end
  end
  return 0
end

local function left(t, now)
  if t > now then
    return t - now
  end
  return 0
end

-- window builds W for a request at now from its values (see the wire format).
local function window(rate, period, burst, alg, overdraft, wa, wb, wc, now)
  local W = {rate, period, burst}
  W[10] = overdraft
  W.alg = alg
  if wb > 0 then
    -- Calendar windows are fixed_window's only: its decisions need the window's end alone.
    if now < wa then
      W.start, W.stop = wa - period, wa -- Redis's clock behind rls's, across a boundary
    elseif now < wb then
      W.start, W.stop = wa, wb
    elseif now < wc then
      W.start, W.stop = wb, wc
    else
      error("rls: Redis's clock is past the calendar windows rls computed: clocks apart by more than a window")
    end
  else
    W.start = now - (now - wa) % period
    W.stop = W.start + period
  end
  return W
end

local function clamp(W, cost)
  if cost < 0 then
    return 0
  end
  if W[10] and W.alg == 1 then
    return math.min(cost, MAX_WINDOW_CHARGE)
  end
  return math.min(cost, W[3] + 1)
end

-- counts returns the hits a fixed or sliding window state holds in W's window and the one
-- before it.
local function counts(s, W)
  local cur, prev = 0, 0
  if s and s[5] == W.alg and s[4] == W[2] then
    if s[1] == W.stop then
      cur, prev = s[2], s[6]
    elseif W.alg == 2 and s[1] == W.start then
      prev = s[2]
    end
  end
  return cur, prev
end

-- A sliding_log log is {e = entries, k = their number, base = hits before the first}: e packs
-- per entry its instant and the hits admitted up to it since the key's first (cumulative), so
-- that a decision finds its first live entry by binary search and counts the live hits with one
-- subtraction, and appends without unpacking the rest.

local function empty_log()
  return {e = "", k = 0, base = 0}
end

-- entry returns the instant and the cumulative hits of entry i of log L (entry 0: (0, base)).
local function entry(L, i)
  if i == 0 then
    return 0, L.base
  end
  local t, c = unpack("<dd", L.e, 16 * i - 15)
  return t, c
end

-- pop returns L less take of the hits of its last entry (all of them: the entry goes).
local function pop(L, take)
  local t, c = entry(L, L.k)
  local _, p = entry(L, L.k - 1)
  local prefix = string.sub(L.e, 1, 16 * (L.k - 1))
  if take >= c - p then
    return {e = prefix, k = L.k - 1, base = L.base}
  end
  return {e = prefix .. pack("<dd", t, c - take), k = L.k, base = L.base}
end

-- at_now returns the hits of L's trailing entries at instant now, and the index of the newest
-- entry before them.
local function at_now(L, now)
  local h, i = 0, L.k
  while i >= 1 do
    local t, c = entry(L, i)
    if t ~= now then
      break
    end
    local _, p = entry(L, i - 1)
    h, i = h + c - p, i - 1
  end
  return h, i
end

-- live returns a log state's entries still within the period at now, and their hits.
local function live(s, W, now)
  if not (s and s[5] == 3 and s[4] == W[2]) then
    return empty_log(), 0
  end
  local L = s[7]
  -- The first entry after now - period: entries are in order of their instants.
  local lo, hi, cut = 1, L.k + 1, now - W[2]
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if entry(L, mid) <= cut then
      lo = mid + 1
    else
      hi = mid
    end
  end
  local _, b = entry(L, lo - 1)
  local _, c = entry(L, L.k)
  if lo > 1 then
    L = {e = string.sub(L.e, 16 * (lo - 1) + 1), k = L.k - lo + 1, base = b}
  end
  return L, c - b
end

-- used is sliding_window's estimate rounded up, in whole milliseconds.
local function used(W, cur, prev, now)
  local p = W[2] / 1000
  local e = floor((now - W.start) / 1000)
  return cur + (divmod(prev * (p - e) + p - 1, p))
end

local function wdecide(s, W, now, cost)
  local rate, period, alg = W[1], W[2], W.alg
  cost = clamp(W, cost)
  if alg == 1 then
    local count = counts(s, W)
    local reset = 0
    if count > 0 then
      reset = left(W.stop, now)
    end
    if count + cost <= rate then
      local n = count + cost
      local r = 0
      if n > 0 then
        r = left(W.stop, now)
      end
      return {W.stop, n, rate, period, 1, 0}, 1, rate - n, 0, r
    end
    if W[10] and cost > 0 then
      -- Charged all the same (window.go's decideFixed): the window is spent until it ends.
      local r = left(W.stop, now)
      return {W.stop, math.min(count + cost, MAX_WINDOW_COUNT), rate, period, 1, 0}, 0, 0, r, r
    end
    local retry = left(W.stop, now)
    if cost > rate then
      retry = retry + period
    end
    return s, 0, math.max(rate - count, 0), retry, reset
  elseif alg == 2 then
    local cur, prev = counts(s, W)
    local u = used(W, cur, prev, now)
    if u + cost <= rate then
      local ns = {W.stop, cur + cost, rate, period, 2, prev}
      return ns, 1, rate - u - cost, 0, left(expiry(ns), now)
    end
    local reset = left(expiry({W.stop, cur, rate, period, 2, prev}), now)
    local p = period / 1000
    local x = rate - cur - cost
    local retry
    if cost > rate then
      retry = reset + period
    elseif x >= 0 then
      retry = left(W.start + (p - (divmod(x * p, prev))) * 1000, now)
    else
      retry = left(W.stop + (p - (divmod((rate - cost) * p, cur))) * 1000, now)
    end
    return s, 0, math.max(rate - u, 0), retry, reset
  end
  -- sliding_log
  local L, n = live(s, W, now)
  if n + cost <= rate then
    if cost > 0 then
      local _, c = entry(L, L.k)
      L = {e = L.e .. pack("<dd", now, c + cost), k = L.k + 1, base = L.base}
    end
    local ns = {0, 0, rate, period, 3, 0, L}
    return ns, 1, rate - n - cost, 0, left(expiry(ns), now)
  end
  local reset = left(expiry({0, 0, rate, period, 3, 0, L}), now)
  local retry
  if cost > rate then
    retry = reset + period
  else
    -- Admitted once the oldest entries holding need hits have left the period.
    local need = L.base + n + cost - rate
    local lo, hi = 1, L.k
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      local _, c = entry(L, mid)
      if c < need then
        lo = mid + 1
      else
        hi = mid
      end
    end
    retry = left(entry(L, lo) + period, now)
  end
  return s, 0, math.max(rate - n, 0), retry, reset
end

local function wrefund(s, W, now, cost)
  local rate, period, alg = W[1], W[2], W.alg
  if cost < 0 then
    cost = 0
  end
  if alg == 3 then
    -- Gives back the most recent hits first.
    local L, n = live(s, W, now)
    while cost > 0 and L.k > 0 do
      local _, c = entry(L, L.k)
      local _, p = entry(L, L.k - 1)
      local take = math.min(cost, c - p)
      L = pop(L, take)
      cost, n = cost - take, n - take
    end
    local ns = {0, 0, rate, period, 3, 0, L}
    return ns, 1, math.max(rate - n, 0), 0, left(expiry(ns), now)
  end
  local cur, prev = counts(s, W)
  cur = math.max(cur - cost, 0)
  local ns = {W.stop, cur, rate, period, alg, prev}
  if alg == 1 then
    local r = 0
    if cur > 0 then
      r = left(W.stop, now)
    end
    return ns, 1, math.max(rate - cur, 0), 0, r
  end
  return ns, 1, math.max(rate - used(W, cur, prev, now), 0), 0, left(expiry(ns), now)
end

-- wdelta is the change a charged call wrote to a window key, for undo: (hits, window end) or,
-- under sliding_log, (hits added, now) and the entries a refund took hits from, as a list of
-- instant, hits pairs in order of instant. Hits are only ever added at now and taken from the
-- newest entries, so the entries both logs share come first.
local function wdelta(before, after, W, now)
  if W.alg == 3 then
    local la = live(after, W, now)
    local lb = live(before, W, now)
    local p, m = 0, math.min(la.k, lb.k)
    while p < m do
      local ta, ca = entry(la, p + 1)
      local tb, cb = entry(lb, p + 1)
      if ta ~= tb or ca ~= cb then
        break
      end
      p = p + 1
    end
    local removed, kept = {}, p
    local _, c0 = entry(lb, p)
    for i = p + 1, lb.k do
      local t, c = entry(lb, i)
      local h = c - c0
      if i == p + 1 and p < la.k then
        local ta, ca = entry(la, i)
        if ta == t and ca < c then
          -- Partly taken: the after log keeps the rest of this entry.
          h, kept = c - ca, i
        end
      end
      removed[#removed + 1] = t
      removed[#removed + 1] = h
      c0 = c
    end
    local _, ck = entry(la, kept)
    local _, cz = entry(la, la.k)
    return cz - ck, now, removed
  end
  local ca = counts(after, W)
  local cb = counts(before, W)
  return ca - cb, W.stop
end

-- restore returns log L with the hits of r (instant, hits pairs in order of instant) back at
-- their instants: into an entry at the same instant, or as a new entry before the later ones.
local function restore(L, r)
  local parts, extra, j, prev = {}, 0, 1, L.base
  for i = 1, L.k do
    local t, c = entry(L, i)
    while j < #r and r[j] < t do
      extra = extra + r[j + 1]
      parts[#parts + 1] = pack("<dd", r[j], prev + extra)
      j = j + 2
    end
    while j < #r and r[j] == t do
      extra, j = extra + r[j + 1], j + 2
    end
    parts[#parts + 1] = pack("<dd", t, c + extra)
    prev = c
  end
  while j < #r do
    extra = extra + r[j + 1]
    parts[#parts + 1] = pack("<dd", r[j], prev + extra)
    j = j + 2
  end
  return {e = table.concat(parts), k = #parts, base = L.base}
end

-- wundo gives back hits that "d" wrote under a window algorithm (see wdelta).
local function wundo(s, alg, rate, period, hits, at, removed)
  if not s and (hits < 0 or #removed > 0) then
    -- A refund emptied the key, which was then deleted: give its hits back to a new state.
    s = {at, 0, rate, period, alg, 0, empty_log()}
  end
  if not (s and s[5] == alg and s[4] == period) then
    return s
  end
  if alg == 3 then
    local L = s[7]
    while hits > 0 and L.k > 0 do
      local t, c = entry(L, L.k)
      if t ~= at then
        break
      end
      local _, p = entry(L, L.k - 1)
      local take = math.min(hits, c - p)
      L, hits = pop(L, take), hits - take
    end
    if #removed > 0 then
      L = restore(L, removed)
    end
    s[7] = L
    return s
  end
  if s[1] == at then
    s[2] = math.min(math.max(s[2] - hits, 0), MAX_WINDOW_COUNT)
  elseif alg == 2 and s[1] == at + period then
    s[6] = math.max(s[6] - hits, 0)
  end
  return s
end

-- parse reads a stored value (nil: none).
local function parse(v)
  if not v then
    return false
  end
  local n = #v
  if n >= 32 and n % 8 == 0 then
    local alg = unpack("<d", v)
    if (alg == 1 or alg == 2) and n == 48 then
      local _, e, c, pv, r, p = unpack("<dddddd", v)
      return {e, c, r, p, alg, pv}
    elseif alg == 3 then
      local _, r, p, k, base = unpack("<ddddd", v)
      if n ~= 40 + 16 * k then
        return false
      end
      return {0, 0, r, p, 3, 0, {e = string.sub(v, 41), k = k, base = base}}
    end
  end
  -- The last byte of the packed form is the high byte of a period >= 1 as a double: 0x3F or
  -- more, never a digit as the text form ends with.
  if #v == 32 and string.byte(v, 32) > 57 then
    local a, b, c, d = unpack("<dddd", v)
    return {a, b, c, d}
  end
  -- The text form "tat frac rate period" that earlier versions of rls stored.
  local a, b, c, d = string.match(v, "^(%-?%d+) (%d+) (%d+) (%d+)$")
  if not a then
    return false -- not a state rls wrote
  end
  return {tonumber(a), tonumber(b), tonumber(c), tonumber(d)}
end

local function load(key)
  return parse(call("GET", key))
end

local function store(key, s, existed, now)
  local alg = s and s[5] or 0
  local left -- until the state holds no usage, in us
  if alg == 0 then
    if not fresh(s, now) then
      left = ceil_us(sub(s[1], s[2], now, 0, s[3]))
    end
  else
    local e = expiry(s)
    if e > now then
      left = e - now
    end
  end
  if not left then
    if existed then
      call("DEL", key)
    end
    return
  end
  -- Expire at the reset, rounded up to whole milliseconds: the state is then no usage at all.
  -- A fixed now (tests) is not Redis's clock: keep such keys a minute longer than the test.
  local ttl = floor((left + 999) / 1000)
  if fixed_now then
    ttl = ttl + 60000
  end
  local v
  if alg == 0 then
    v = pack("<dddd", s[1], s[2], s[3], s[4])
  elseif alg == 3 then
    local L = s[7]
    v = pack("<ddddd", 3, s[3], s[4], L.k, L.base) .. L.e
  else
    v = pack("<dddddd", alg, s[1], s[2], s[6], s[3], s[4])
  end
  call("PSETEX", key, ttl, v)
end

local function clock(arg)
  local now = tonumber(arg)
  fixed_now = now ~= 0
  if now == 0 then
    local t = call("TIME")
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- The last limit built, reused while the keys that follow share it, as they usually do, and
-- across the calls of a library. One value, replaced whole: a call stopped part way (FUNCTION
-- KILL) cannot leave it describing one limit with another's values.
local last_limit
local function limit_of(rate, period, burst, overdraft)
  local L = last_limit
  if not L or L[1] ~= rate or L[2] ~= period or L[3] ~= burst or L[10] ~= overdraft then
    L = limit(rate, period, burst, overdraft)
    last_limit = L
  end
  return L
end

-- flags splits a request's flags: refund, mode, overdraft, algorithm.
local function split(flags)
  return flags % 2 == 1, floor(flags / 2) % 4, floor(flags / 8) % 2 == 1, floor(flags / 16)
end

-- request_limit is the limit a request's values describe: GCRA's L, or a window's W.
local function request_limit(rate, period, burst, od, alg, wa, wb, wc, now)
  if alg == 0 then
    return limit_of(rate, period, burst, od)
  end
  return window(rate, period, burst, alg, od, wa, wb, wc, now)
end

-- The call being run: its keys, its values and its instant (see run).
local KEYS_, ARGV_, now

-- undo runs an "u" call.
local function undo()
  local args, pos = ARGV_[3], 1
  for i = 1, #KEYS_ do
    local rate, period, burst, dus, df, od, m
    rate, period, burst, dus, df, od, m, pos = unpack("<ddddddd", args, pos)
    local removed = {}
    for j = 1, 2 * m do
      removed[j], pos = unpack("<d", args, pos)
    end
    local alg = floor(od / 2)
    if alg ~= 0 then
      local s = load(KEYS_[i])
      local ns = wundo(s, alg, rate, period, dus, df, removed)
      if ns then
        store(KEYS_[i], ns, s ~= false, now)
      end
    else
    local L = limit_of(rate, period, burst, od % 2 == 1)
    local s = load(KEYS_[i])
    local tus, tf = current(s, L, now)
    tus, tf = sub(tus, tf, dus, df, rate)
    if less(tus, tf, now, 0) then
      tus, tf = now, 0
    end
    local mus, mf = add(now, 0, L[11], L[12], rate)
    if less(mus, mf, tus, tf) then
      tus, tf = mus, mf
    end
    store(KEYS_[i], {tus, tf, rate, L[2]}, s ~= false, now)
    end
  end
  return ""
end

-- states holds per key the state after the batches of this call charged so far, stored the
-- state before them: only keys whose state changed are written, once, at the end.
local states, stored

local function state(key)
  local s = states[key]
  if s == nil then
    s = load(key)
    states[key], stored[key] = s, s
  end
  return s
end

-- prefetch reads every key's state with MGET, in chunks that unpack can pass: one command for
-- the whole call instead of a GET per key. (MGET reads a key of another type as none; the SET
-- that stores a state would overwrite it anyway.)
local function prefetch()
  for i = 1, #KEYS_, 1000 do
    local j = math.min(i + 999, #KEYS_)
    local vals = call("MGET", unpack_list(KEYS_, i, j))
    for k = i, j do
      local key = KEYS_[k]
      if states[key] == nil then
        local s = parse(vals[k - i + 1])
        states[key], stored[key] = s, s
      end
    end
  end
end

-- out collects the reply's packed parts; nout is its length.
local out, nout
local function emit(p)
  nout = nout + 1
  out[nout] = p
end

-- apply decides a request of cost under L on the state s, or refunds it.
local function apply(s, L, cost, refunds)
  if L.alg then
    if refunds then
      return wrefund(s, L, now, cost)
    end
    return wdecide(s, L, now, cost)
  end
  if s and s[5] then
    s = false -- another algorithm's state: no usage under GCRA
  end
  if refunds then
    return refund(s, L, now, cost)
  end
  return decide(s, L, now, cost)
end

-- refuses says whether a denied request refuses its batch: not an overdraft charge (see
-- backend.Charged), which is charged all the same.
local function refuses(L, cost, refunds)
  return not (L[10] and cost > 0 and not refunds)
end

-- single decides a batch of one key, KEYS_[k0 + 1], as batch does, without its tables: most
-- batches are one descriptor under one limit.
local function single(k0, args, quota_refuse)
  local key = KEYS_[k0 + 1]
  local rate, period, burst, cost, flags, wa, wb, wc = unpack("<dddddddd", args)
  local refunds, mode, od, alg = split(flags)
  local L = request_limit(rate, period, burst, od, alg, wa, wb, wc, now)
  local s = state(key)
  local ns, ok, rem, retry, reset = apply(s, L, cost, refunds)
  local charge = quota_refuse >= 0
  if ok == 0 and refuses(L, cost, refunds) then
    if mode == 0 or (mode == 2 and quota_refuse == 1) then
      charge = false
    end
  end
  if charge then
    states[key] = ns
  elseif ok == 1 then
    -- Allowed in a refused batch: a check of the state the batch found.
    local _
    _, _, rem, _, reset = apply(s, L, 0, false)
  end
  emit(pack("<ddddd", charge and 1 or 0, ok, rem, retry, reset))
  return 1
end

-- batch decides the batch of n keys from KEYS_[k0 + 1] on, appending its reply to out.
local function batch(k0, args, quota_refuse, multi)
  local n = #args / 64
  if n == 1 and not multi then
    return single(k0, args, quota_refuse)
  end
  local cur, last, lim, res = {}, {}, {}, {}
  local enforce_denied, quota_denied = false, 0
  local pos = 1
  for i = 1, n do
    local key = KEYS_[k0 + i]
    local rate, period, burst, cost, flags, wa, wb, wc
    rate, period, burst, cost, flags, wa, wb, wc, pos = unpack("<dddddddd", args, pos)
    local refunds, mode, od, alg = split(flags)
    local L = request_limit(rate, period, burst, od, alg, wa, wb, wc, now)
    lim[i] = L
    local s = cur[key]
    if s == nil then
      s = state(key)
    end
    local ns, ok, rem, retry, reset = apply(s, L, cost, refunds)
    cur[key] = ns
    last[key] = i
    if ok == 0 and refuses(L, cost, refunds) then
      if mode == 0 then
        enforce_denied = true
      elseif mode == 2 then
        quota_denied = quota_denied + 1
      end
    end
    local o = 4 * i - 3
    res[o], res[o + 1], res[o + 2], res[o + 3] = ok, rem, retry, reset
  end

  -- The batch is refused here when an enforced request is denied, or the quota requests that
  -- were left to deny it are, or it was refused before this call.
  local charge = quota_refuse >= 0 and not enforce_denied and not (quota_refuse > 0 and quota_denied >= quota_refuse)

  if not charge then
    -- Allowed requests of a refused batch report a check of the state the batch found.
    for i = 1, n do
      if res[4 * i - 3] == 1 then
        local _, _, rem, _, reset = apply(states[KEYS_[k0 + i]], lim[i], 0, false)
        res[4 * i - 2], res[4 * i] = rem, reset
      end
    end
  end
  emit(pack("<d", charge and 1 or 0))
  for i = 1, n do
    local o = 4 * i - 3
    emit(pack("<dddd", res[o], res[o + 1], res[o + 2], res[o + 3]))
  end
  if multi then
    for i = 1, n do
      local rem, reset = 0, 0
      if res[4 * i - 3] == 1 and charge then
        local _
        _, _, rem, _, reset = apply(states[KEYS_[k0 + i]], lim[i], 0, false)
      end
      local key = KEYS_[k0 + i]
      local dus, df, removed = 0, 0, nil
      if charge and last[key] == i then
        local L = lim[i]
        if L.alg then
          dus, df, removed = wdelta(states[key], cur[key], L, now)
        else
          local aus, af = current(cur[key], L, now)
          local bus, bf = current(states[key], L, now)
          dus, df = sub(aus, af, bus, bf, L[1])
        end
      end
      local m = removed and #removed / 2 or 0
      emit(pack("<ddddd", rem, reset, dus, df, m))
      for j = 1, 2 * m do
        emit(pack("<d", removed[j]))
      end
    end
  end
  if charge then
    for key in pairs(last) do
      states[key] = cur[key]
    end
  end
  return n
end

-- run runs one call: keys and argv are the KEYS and ARGV of the wire format above. Under EVAL the
-- script ends by returning run(KEYS, ARGV); loaded as a library of Redis Functions it registers
-- run, and the definitions above are built once rather than on every call (see script.go).
local function run(keys, argv)
  if not call then
    bind()
    unpack = struct.unpack
  end
  KEYS_, ARGV_ = keys, argv
  now = clock(argv[2])
  if argv[1] == "u" then
    return undo()
  end
  states, stored, out, nout = {}, {}, {}, 0
  if #keys > 1 then
    prefetch() -- a lone key is cheaper with GET
  end
  if argv[1] == "m" then
    local k0 = 0
    for b = 3, #argv, 2 do
      k0 = k0 + batch(k0, argv[b + 1], tonumber(argv[b]), false)
    end
  else
    batch(0, argv[5], tonumber(argv[3]), argv[4] == "1")
  end
  for key, s in pairs(states) do
    -- A key whose requests were all denied still holds its stored state: leave it alone.
    if s ~= stored[key] then
      store(key, s, stored[key] ~= false, now)
    end
  end
  local reply = table.concat(out)
  states, stored, out = nil, nil, nil
  return reply
end
