-- The four algorithms of rls (gcra, fixed_window, sliding_window, sliding_log):
-- backend.DecideBatch (internal/backend) in one atomic call.
--
-- The contract with Go (the operations, ARGV's positions, the records of doubles a call
-- carries and its reply returns, the stored states, the flags) is contract.go's: the constants
-- it names (OP_*, ARG_*, FLAG_*, MODE_*, ALG_*, <record>_FMT, _WORDS, _BYTES) are rendered from
-- it into the lines before this file. Read every position, format and bit by those names, and
-- unpack a record into variables named as contract.go names its fields: TestContract checks both.
--
-- One file, over 500 lines, on purpose: Redis runs a script (EVAL) or a library of Functions as
-- one text with no way to load another, so every operation the script serves (decide, the
-- fast path, undo, refund, give-back) and the four algorithms live here, in the order a call
-- runs them.
--
-- Time is integer microseconds from Redis TIME, so every replica of rls agrees on it. A TAT is
-- exact: us + frac/rate microseconds with 0 <= frac < rate. A key stores its state (a
-- GCRA_STATE, WINDOW_STATE or LOG_STATE record) with an expiry at its reset, when it holds no
-- usage any more. Every value is an integer below 2^53, so exact as a double, and
-- struct.pack/unpack cost a tenth of formatting and parsing text.
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
-- Overdraft (see backend.Decide): a denied charge of cost > 0 under an overdraft limit is
-- written anyway, its TAT saturating at now + MAX_TOLERANCE, and never refuses its batch. With
-- that bound every TAT stays below now + 2*MAX_TOLERANCE < 2^53 (until the year 2055).

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
  local rate, pr = L.rate, L.pr
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
  return n * L.pq + q, r
end

-- limit is a limit with what every decision under it needs: rate, period, burst, pq, pr,
-- full_us, full_frac, one_us, one_frac, overdraft, most_us, most_frac, where period =
-- pq*rate + pr, so that one emission interval is (pq, pr), a full burst is (full_us,
-- full_frac), the cost of one request (one_us, one_frac) and the most a state may hold
-- (most_us, most_frac): a full burst, or under overdraft (or shared: gcra.go's Limit.Shared)
-- MAX_TOLERANCE.
local function limit(rate, period, burst, overdraft, shared)
  local pq, pr = divmod(period, rate)
  local L = {rate = rate, period = period, burst = burst, pq = pq, pr = pr, full_us = 0, full_frac = 0,
    one_us = 0, one_frac = 0, overdraft = overdraft, shared = shared, most_us = 0, most_frac = 0}
  L.full_us, L.full_frac = interval(burst, L)
  L.one_us, L.one_frac = interval(1, L)
  if overdraft or shared then
    L.most_us = MAX_TOLERANCE
  else
    L.most_us, L.most_frac = L.full_us, L.full_frac
  end
  return L
end

-- count returns floor(d/T) for a span d >= 0 of fewer than 2^34 emission intervals.
local function count(dus, df, L)
  local x = dus * L.rate + df
  if x < TWO53 then
    if x < 0 then
      return 0
    end
    return (divmod(x, L.period))
  end
  local n = floor(x / L.period)
  local ius, ifr = interval(n, L)
  if less(dus, df, ius, ifr) then
    return n - 1
  end
  ius, ifr = add(ius, ifr, L.pq, L.pr, L.rate)
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

-- A state is a table {tat, frac, rate, period} (the TAT tat + frac/rate µs), or false for none.
local function fresh(s, now)
  return not s or s.alg ~= nil or s.tat < now or (s.tat == now and s.frac == 0)
end

-- current returns the TAT of s under L at now, as gcra.go's current: never before now, a state
-- written under another limit keeps the requests it holds (rounded up), capped at a full burst.
local function current(s, L, now)
  if fresh(s, now) then
    return now, 0
  end
  local rate = L.rate
  local hus, hf
  if s.rate == rate and s.period == L.period then
    hus, hf = sub(s.tat, s.frac, now, 0, rate)
  else
    local orate, operiod = s.rate, s.period
    if orate <= 0 or operiod <= 0 or s.frac < 0 or s.frac >= orate or s.tat - now > MAX_TOLERANCE then
      return now, 0 -- not a state rls wrote
    end
    local dus, df = sub(s.tat, s.frac, now, 0, orate)
    local n
    if dus * orate / operiod > SPAN_CAP then
      n = SPAN_CAP -- more than SPAN_CAP intervals (a debt): more than any burst
    else
      local O = limit(orate, operiod, 1, false, false)
      n = count(dus, df, O)
      local ius, ifr = interval(n, O)
      if less(ius, ifr, dus, df) then
        n = n + 1
      end
    end
    if L.shared then
      -- Every request held is kept, up to what MAX_TOLERANCE holds (so the span fits).
      if MAX_TOLERANCE * rate / L.period <= SPAN_CAP then
        n = math.min(n, count(MAX_TOLERANCE, 0, L))
      end
    elseif n > L.burst then
      n = L.burst
    end
    hus, hf = interval(n, L)
  end
  if less(L.most_us, L.most_frac, hus, hf) then
    hus, hf = L.most_us, L.most_frac
  end
  return add(now, 0, hus, hf, rate)
end

-- overdrawn is gcra.go's overdrawn: the state after a denied charge of cost > 0 under overdraft
-- on the TAT (tus, tf), the TAT plus the cost, saturated at now + MAX_TOLERANCE.
local function overdrawn(L, now, tus, tf, cost)
  local rate = L.rate
  local rus, rf = sub(now + MAX_TOLERANCE, 0, tus, tf, rate)
  local cus, cf = interval(cost, L)
  if less(rus, rf, cus, cf) then
    return {tat = now + MAX_TOLERANCE, frac = 0, rate = rate, period = L.period}
  end
  local nus, nf = add(tus, tf, cus, cf, rate)
  return {tat = nus, frac = nf, rate = rate, period = L.period}
end

-- debt is gcra.go's Decide for a denied charge under overdraft, charged all the same: the state
-- after it, and a decision describing that state: 0 remaining, retry once the debt is repaid,
-- reset once a full burst is back.
local function debt(L, now, tus, tf, cost)
  local rate = L.rate
  local ns = overdrawn(L, now, tus, tf, cost)
  local rus, rf = sub(ns.tat, ns.frac, L.full_us, L.full_frac, rate)
  return ns, 0, 0, ceil_us(sub(rus, rf, now, 0, rate)), ceil_us(sub(ns.tat, ns.frac, now, 0, rate))
end

-- charge_fresh is decide's charge of 0 <= cost <= burst on a key that holds no usage: a full
-- burst remains and the cost is admitted. The TAT after it, remaining and reset.
local function charge_fresh(L, now, cost)
  local cus, cf
  if cost == 1 then
    cus, cf = L.one_us, L.one_frac
  else
    cus, cf = interval(cost, L)
  end
  return now + cus, cf, L.burst - cost, ceil_us(cus, cf)
end

-- gcra is decide's arithmetic for a charge of cost >= 0 on the current TAT (tus, tf) (never
-- before now): allowed, remaining, retry and reset, and when allowed the TAT after the charge.
-- Denials are as without overdraft; decide turns them into a debt under it.
local function gcra(L, now, tus, tf, cost)
  local rate = L.rate
  local aus, af = add(now, 0, L.full_us, L.full_frac, rate)
  local hus, hf = sub(aus, af, tus, tf, rate)
  local remaining = count(hus, hf, L)
  if cost > L.burst then
    -- Never admitted: retry no sooner than a full burst after the key is back to one.
    local reset = ceil_us(sub(tus, tf, now, 0, rate))
    return 0, remaining, ceil_us(L.full_us, L.full_frac) + reset, reset
  end
  local cus, cf = interval(cost, L)
  local nus, nf = add(tus, tf, cus, cf, rate)
  local wus, wf = sub(nus, nf, L.full_us, L.full_frac, rate)
  if less(now, 0, wus, wf) then
    return 0, remaining, ceil_us(sub(wus, wf, now, 0, rate)), ceil_us(sub(tus, tf, now, 0, rate))
  end
  return 1, remaining - cost, 0, ceil_us(sub(nus, nf, now, 0, rate)), nus, nf
end

-- decide is gcra.go's Decide: the new state (s itself when denied) and the decision.
local function decide(s, L, now, cost)
  if cost < 0 then
    cost = 0
  end
  local tus, tf
  if not s or s.tat < now or (s.tat == now and s.frac == 0) then
    -- Fresh (as fresh() says, inlined): the common case, taken without the general arithmetic.
    if cost <= L.burst then
      local nus, nf, remaining, reset = charge_fresh(L, now, cost)
      return {tat = nus, frac = nf, rate = L.rate, period = L.period}, 1, remaining, 0, reset
    end
    tus, tf = now, 0
  else
    tus, tf = current(s, L, now)
  end
  local ok, remaining, retry, reset, nus, nf = gcra(L, now, tus, tf, cost)
  if ok == 0 then
    if L.overdraft and cost > 0 then
      return debt(L, now, tus, tf, cost)
    end
    return s, 0, remaining, retry, reset
  end
  return {tat = nus, frac = nf, rate = L.rate, period = L.period}, 1, remaining, 0, reset
end

-- own_terms is gcra.go's OwnTerms: a refund under L gives back to s in s's own terms.
local function own_terms(s, L, now)
  return s and not fresh(s, now) and not (s.rate == L.rate and s.period == L.period)
    and s.rate > 0 and s.period > 0 and s.frac >= 0 and s.frac < s.rate
end

-- refund is gcra.go's Refund, refundOwn included: a state written under another rate or period
-- gets the requests back in its own terms, neither re-expressed under L nor capped at its burst.
local function refund(s, L, now, cost)
  local rate = L.rate
  if cost > L.burst then
    cost = L.burst
  end
  local ns, tus, tf
  if own_terms(s, L, now) then
    ns = s
    if cost > 0 then
      local O = limit(s.rate, s.period, 1, false)
      local dus, df = sub(s.tat, s.frac, now, 0, s.rate)
      local n = SPAN_CAP -- more than SPAN_CAP intervals: more than any cost
      if dus * s.rate / s.period <= SPAN_CAP then
        n = count(dus, df, O)
      end
      if cost > n then
        ns = {tat = now, frac = 0, rate = s.rate, period = s.period}
      else
        local cus, cf = interval(cost, O)
        local nus, nf = sub(s.tat, s.frac, cus, cf, s.rate)
        ns = {tat = nus, frac = nf, rate = s.rate, period = s.period}
      end
    end
    tus, tf = current(ns, L, now)
  else
    tus, tf = current(s, L, now)
    if cost > 0 then
      local cus, cf = interval(cost, L)
      tus, tf = sub(tus, tf, cus, cf, rate)
      if less(tus, tf, now, 0) then
        tus, tf = now, 0
      end
    end
    ns = {tat = tus, frac = tf, rate = rate, period = L.period}
  end
  local aus, af = add(now, 0, L.full_us, L.full_frac, rate)
  local hus, hf = sub(aus, af, tus, tf, rate)
  return ns, 1, count(hus, hf, L), 0, ceil_us(sub(tus, tf, now, 0, rate))
end

-- The window algorithms, as backend/window.go. A state is {stop (the window's end, or 0),
-- count, rate, period, alg, prev (the previous window's count), log}; a limit W is {rate,
-- period, burst, overdraft, alg, start, stop}.
-- (MAX_WINDOW_CHARGE and MAX_WINDOW_COUNT, the bounds of a fixed window's charge and count,
-- are limit's, rendered from contract.go.)

-- expiry returns the instant from which a window state holds no usage.
local function expiry(s)
  local alg = s.alg
  if alg == ALG_FIXED_WINDOW then
    if s.count > 0 then
      return s.stop
    end
  elseif alg == ALG_SLIDING_WINDOW then
    if s.count > 0 then
      return s.stop + s.period
    elseif s.prev > 0 then
      return s.stop
    end
  elseif alg == ALG_SLIDING_LOG then
    local L = s.log
    if L.k >= 1 then
      return unpack(LOG_ENTRY_FMT, L.e, LOG_ENTRY_BYTES * (L.k - 1) + 1) + s.period
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

-- window builds W for a request at now from its key record (see contract.go).
local function window(rate, period, burst, alg, overdraft, wa, wb, wc, now)
  local W = {rate = rate, period = period, burst = burst, overdraft = overdraft, alg = alg}
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
  if W.overdraft and W.alg == ALG_FIXED_WINDOW then
    return math.min(cost, MAX_WINDOW_CHARGE)
  end
  return math.min(cost, W.burst + 1)
end

-- counts returns the hits a fixed or sliding window state holds in W's window and the one
-- before it.
local function counts(s, W)
  local cur, prev = 0, 0
  if s and s.alg == W.alg and s.period == W.period then
    if s.stop == W.stop then
      cur, prev = s.count, s.prev
    elseif W.alg == ALG_SLIDING_WINDOW and s.stop == W.start then
      prev = s.count
    end
  end
  return cur, prev
end

-- A sliding_log log is {e = entries, k = their number, base = hits before the first}: e packs
-- per entry its instant and the hits admitted up to it since the key's first (cumulative), so
-- that a decision finds its first live entry by binary search and counts the live hits with one
-- subtraction, and appends without unpacking the rest.

-- log_entry packs an entry of a log.
local function log_entry(instant, total)
  return pack(LOG_ENTRY_FMT, instant, total)
end

local function empty_log()
  return {e = "", k = 0, base = 0}
end

-- entry returns the instant and the cumulative hits of entry i of log L (entry 0: (0, base)).
local function entry(L, i)
  if i == 0 then
    return 0, L.base
  end
  local instant, total = unpack(LOG_ENTRY_FMT, L.e, LOG_ENTRY_BYTES * (i - 1) + 1)
  return instant, total
end

-- pop returns L less take of the hits of its last entry (all of them: the entry goes).
local function pop(L, take)
  local t, c = entry(L, L.k)
  local _, p = entry(L, L.k - 1)
  local prefix = string.sub(L.e, 1, LOG_ENTRY_BYTES * (L.k - 1))
  if take >= c - p then
    return {e = prefix, k = L.k - 1, base = L.base}
  end
  return {e = prefix .. log_entry(t, c - take), k = L.k, base = L.base}
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
  if not (s and s.alg == ALG_SLIDING_LOG and s.period == W.period) then
    return empty_log(), 0
  end
  local L = s.log
  -- The first entry after now - period: entries are in order of their instants.
  local lo, hi, cut = 1, L.k + 1, now - W.period
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
    L = {e = string.sub(L.e, LOG_ENTRY_BYTES * (lo - 1) + 1), k = L.k - lo + 1, base = b}
  end
  return L, c - b
end

-- used is sliding_window's estimate rounded up, in whole milliseconds.
local function used(W, cur, prev, now)
  local p = W.period / 1000
  local e = floor((now - W.start) / 1000)
  return cur + (divmod(prev * (p - e) + p - 1, p))
end

local function wdecide(s, W, now, cost)
  local rate, period, alg = W.rate, W.period, W.alg
  cost = clamp(W, cost)
  if alg == ALG_FIXED_WINDOW then
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
      return {stop = W.stop, count = n, rate = rate, period = period, alg = ALG_FIXED_WINDOW, prev = 0}, 1, rate - n, 0, r
    end
    if W.overdraft and cost > 0 then
      -- Charged all the same (window.go's decideFixed): the window is spent until it ends.
      local r = left(W.stop, now)
      return {stop = W.stop, count = math.min(count + cost, MAX_WINDOW_COUNT), rate = rate, period = period, alg = ALG_FIXED_WINDOW, prev = 0}, 0, 0, r, r
    end
    local retry = left(W.stop, now)
    if cost > rate then
      retry = retry + period
    end
    return s, 0, math.max(rate - count, 0), retry, reset
  elseif alg == ALG_SLIDING_WINDOW then
    local cur, prev = counts(s, W)
    local u = used(W, cur, prev, now)
    if u + cost <= rate then
      local ns = {stop = W.stop, count = cur + cost, rate = rate, period = period, alg = ALG_SLIDING_WINDOW, prev = prev}
      return ns, 1, rate - u - cost, 0, left(expiry(ns), now)
    end
    local reset = left(expiry({stop = W.stop, count = cur, rate = rate, period = period, alg = ALG_SLIDING_WINDOW, prev = prev}), now)
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
      L = {e = L.e .. log_entry(now, c + cost), k = L.k + 1, base = L.base}
    end
    local ns = {stop = 0, count = 0, rate = rate, period = period, alg = ALG_SLIDING_LOG, prev = 0, log = L}
    return ns, 1, rate - n - cost, 0, left(expiry(ns), now)
  end
  local reset = left(expiry({stop = 0, count = 0, rate = rate, period = period, alg = ALG_SLIDING_LOG, prev = 0, log = L}), now)
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
  local rate, period, alg = W.rate, W.period, W.alg
  if cost < 0 then
    cost = 0
  end
  if alg == ALG_SLIDING_LOG then
    -- Gives back the most recent hits first.
    local L, n = live(s, W, now)
    while cost > 0 and L.k > 0 do
      local _, c = entry(L, L.k)
      local _, p = entry(L, L.k - 1)
      local take = math.min(cost, c - p)
      L = pop(L, take)
      cost, n = cost - take, n - take
    end
    local ns = {stop = 0, count = 0, rate = rate, period = period, alg = ALG_SLIDING_LOG, prev = 0, log = L}
    return ns, 1, math.max(rate - n, 0), 0, left(expiry(ns), now)
  end
  local cur, prev = counts(s, W)
  cur = math.max(cur - cost, 0)
  local ns = {stop = W.stop, count = cur, rate = rate, period = period, alg = alg, prev = prev}
  if alg == ALG_FIXED_WINDOW then
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
  if W.alg == ALG_SLIDING_LOG then
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
      parts[#parts + 1] = log_entry(r[j], prev + extra)
      j = j + 2
    end
    while j < #r and r[j] == t do
      extra, j = extra + r[j + 1], j + 2
    end
    parts[#parts + 1] = log_entry(t, c + extra)
    prev = c
  end
  while j < #r do
    extra = extra + r[j + 1]
    parts[#parts + 1] = log_entry(r[j], prev + extra)
    j = j + 2
  end
  return {e = table.concat(parts), k = #parts, base = L.base}
end

-- wundo gives back hits that "d" wrote under a window algorithm (see wdelta).
local function wundo(s, alg, rate, period, hits, at, removed)
  if not s and (hits < 0 or #removed > 0) then
    -- A refund emptied the key, which was then deleted: give its hits back to a new state.
    s = {stop = at, count = 0, rate = rate, period = period, alg = alg, prev = 0, log = empty_log()}
  end
  if not (s and s.alg == alg and s.period == period) then
    return s
  end
  if alg == ALG_SLIDING_LOG then
    local L = s.log
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
    s.log = L
    return s
  end
  if s.stop == at then
    s.count = math.min(math.max(s.count - hits, 0), MAX_WINDOW_COUNT)
  elseif alg == ALG_SLIDING_WINDOW and s.stop == at + period then
    s.prev = math.max(s.prev - hits, 0)
  end
  return s
end

-- parse reads a stored value (nil: none): one of the stored states of contract.go.
local function parse(v)
  if not v then
    return false
  end
  local n = #v
  if n >= GCRA_STATE_BYTES and n % 8 == 0 then
    local alg = unpack(DOUBLE_FMT, v)
    if (alg == ALG_FIXED_WINDOW or alg == ALG_SLIDING_WINDOW) and n == WINDOW_STATE_BYTES then
      local _, stop, count, prev, rate, period = unpack(WINDOW_STATE_FMT, v)
      return {stop = stop, count = count, rate = rate, period = period, alg = alg, prev = prev}
    elseif alg == ALG_SLIDING_LOG then
      local _, rate, period, entries, base = unpack(LOG_STATE_FMT, v)
      if n ~= LOG_STATE_BYTES + LOG_ENTRY_BYTES * entries then
        return false
      end
      return {stop = 0, count = 0, rate = rate, period = period, alg = ALG_SLIDING_LOG, prev = 0,
        log = {e = string.sub(v, LOG_STATE_BYTES + 1), k = entries, base = base}}
    end
  end
  -- The last byte of the packed form is the high byte of a period >= 1 as a double: 0x3F or
  -- more, never a digit as the text form ends with.
  if n == GCRA_STATE_BYTES and string.byte(v, n) > 57 then
    local tat, frac, rate, period = unpack(GCRA_STATE_FMT, v)
    return {tat = tat, frac = frac, rate = rate, period = period}
  end
  -- The text form "tat frac rate period" that earlier versions of rls stored.
  local tat, frac, rate, period = string.match(v, "^(%-?%d+) (%d+) (%d+) (%d+)$")
  if not tat then
    return false -- not a state rls wrote
  end
  return {tat = tonumber(tat), frac = tonumber(frac), rate = tonumber(rate), period = tonumber(period)}
end

local function load(key)
  return parse(call("GET", key))
end

local function store(key, s, existed, now)
  local alg = s and s.alg or 0
  local left -- until the state holds no usage, in us
  if alg == ALG_GCRA then
    if not fresh(s, now) then
      left = ceil_us(sub(s.tat, s.frac, now, 0, s.rate))
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
  if alg == ALG_GCRA then
    v = pack(GCRA_STATE_FMT, s.tat, s.frac, s.rate, s.period)
  elseif alg == ALG_SLIDING_LOG then
    local log = s.log
    local entries, base = log.k, log.base
    v = pack(LOG_STATE_FMT, alg, s.rate, s.period, entries, base) .. log.e
  else
    v = pack(WINDOW_STATE_FMT, alg, s.stop, s.count, s.prev, s.rate, s.period)
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
local function limit_of(rate, period, burst, overdraft, shared)
  local L = last_limit
  if not L or L.rate ~= rate or L.period ~= period or L.burst ~= burst or L.overdraft ~= overdraft or
      L.shared ~= shared then
    L = limit(rate, period, burst, overdraft, shared)
    last_limit = L
  end
  return L
end

-- split splits a request's flags (contract.go's requestFlags): refund, mode, overdraft,
-- algorithm, shared.
local function split(flags)
  return floor(flags / FLAG_REFUND) % 2 == 1, floor(flags / FLAG_MODE) % MODE_SPAN,
    floor(flags / FLAG_OVERDRAFT) % 2 == 1, floor(flags / FLAG_ALG) % ALG_SPAN,
    floor(flags / FLAG_SHARED) % 2 == 1
end

-- request_limit is the limit a request's values describe: GCRA's L, or a window's W.
local function request_limit(rate, period, burst, od, alg, wa, wb, wc, now, shared)
  if alg == ALG_GCRA then
    return limit_of(rate, period, burst, od, shared)
  end
  return window(rate, period, burst, alg, od, wa, wb, wc, now)
end

-- The call being run: its keys, its values and its instant (see run).
local KEYS_, ARGV_, now

-- undo runs an OP_UNDO call: per key an UNDO record and its ENTRY records.
local function undo()
  local args, pos = ARGV_[ARG_UNDO], 1
  for i = 1, #KEYS_ do
    local rate, period, burst, delta_us, delta_frac, flags, entries
    rate, period, burst, delta_us, delta_frac, flags, entries, pos = unpack(UNDO_FMT, args, pos)
    local removed = {}
    for j = 1, entries do
      local instant, hits
      instant, hits, pos = unpack(ENTRY_FMT, args, pos)
      removed[2 * j - 1], removed[2 * j] = instant, hits
    end
    local _, _, od, alg, shared = split(flags)
    local s = load(KEYS_[i])
    if alg ~= ALG_GCRA then
      local ns = wundo(s, alg, rate, period, delta_us, delta_frac, removed)
      if ns then
        store(KEYS_[i], ns, s ~= false, now)
      end
    else
      local L = limit_of(rate, period, burst, od, shared)
      local tus, tf = current(s, L, now)
      tus, tf = sub(tus, tf, delta_us, delta_frac, rate)
      if less(tus, tf, now, 0) then
        tus, tf = now, 0
      end
      local mus, mf = add(now, 0, L.most_us, L.most_frac, rate)
      if less(mus, mf, tus, tf) then
        tus, tf = mus, mf
      end
      store(KEYS_[i], {tat = tus, frac = tf, rate = rate, period = L.period}, s ~= false, now)
    end
  end
  return ""
end

-- giveback runs an OP_GIVEBACK call: per key a GIVEBACK record, the hits a lease did not use.
-- Nothing goes back once the lease has expired (late), nor more than the hits of the lease's
-- charge still ahead of now: under GCRA the lease's hits are the last of its charge, which
-- ended at held_until, so that only what is between now and held_until is still held (time
-- restored the rest); under fixed_window, only while the key's window is the lease's (it ends
-- at held_until). A GCRA state goes back in its own terms, whatever the limit it was written
-- under: never re-expressed under the lease's limit nor capped at its burst, so that a replica
-- whose rule differs (a rollout) takes back only its hits.
local function giveback()
  local args, pos = ARGV_[ARG_GIVEBACK], 1
  local reply = {}
  for i = 1, #KEYS_ do
    local hits, held_until, expires, rate, period, flags
    hits, held_until, expires, rate, period, flags, pos = unpack(GIVEBACK_FMT, args, pos)
    local _, _, _, alg = split(flags)
    local given, late = 0, 0
    if now >= expires then
      late = 1
    elseif hits > 0 and held_until > now then
      local key = KEYS_[i]
      local s = load(key)
      if alg == ALG_GCRA then
        if s and not s.alg and s.rate > 0 and s.period > 0 and s.frac >= 0 and s.frac < s.rate and not fresh(s, now)
          and held_until - now <= MAX_TOLERANCE then
          -- The lease's hits still ahead of now, in its own limit's terms.
          local Lr = limit(rate, period, 1, false)
          local hus, hf = interval(hits, Lr)
          local ahead = hits
          if not less(hus, hf, held_until - now, 0) then
            ahead = count(held_until - now, 0, Lr) -- fewer than hits: within count's span
          end
          if ahead > 0 then
            local S = limit(s.rate, s.period, 1, false)
            local cus, cf = interval(ahead, S)
            local tus, tf = sub(s.tat, s.frac, cus, cf, s.rate)
            if less(tus, tf, now, 0) then
              tus, tf = now, 0
            end
            store(key, {tat = tus, frac = tf, rate = s.rate, period = s.period}, true, now)
            given = ahead
          end
        end
      elseif alg == ALG_FIXED_WINDOW then
        if s and s.alg == ALG_FIXED_WINDOW and s.stop == held_until and s.period == period and s.count > 0 then
          given = math.min(hits, s.count)
          s.count = s.count - given
          store(key, s, true, now)
        end
      end
    end
    reply[i] = pack(GIVEN_FMT, given, late)
  end
  return table.concat(reply)
end

-- states holds per key the state after the batches of this call that the general path decided
-- charged so far (a table, or false for none), and stored what it read of the key: only those
-- whose state changed are written, at the end. raw holds the values read but not parsed yet
-- (false: none), and the packed GCRA_STATE the fast path charged; put_* list the fast path's
-- writes (key, expiry in ms, value), in order, also made at the end. Nothing is written before
-- the last batch is decided, so a call that fails part way (an error) charges nothing.
local states, stored, raw
local put_keys, put_ttls, put_values, nput

local function state(key)
  local s = states[key]
  if s == nil then
    local v = raw[key]
    if v == nil then
      s = load(key)
    else
      s = parse(v)
    end
    states[key], stored[key] = s, s
  end
  return s
end

-- prefetch reads every key's value with MGET, in chunks that unpack can pass: one command for
-- the whole call instead of a GET per key. (MGET reads a key of another type as none; the SET
-- that stores a state would overwrite it anyway.) The values are parsed when a key is decided.
local function prefetch()
  for i = 1, #KEYS_, 1000 do
    local j = math.min(i + 999, #KEYS_)
    local vals = call("MGET", unpack_list(KEYS_, i, j))
    for k = i, j do
      local key = KEYS_[k]
      if raw[key] == nil then
        raw[key] = vals[k - i + 1]
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
  if s and s.alg then
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
  return not (L.overdraft and cost > 0 and not refunds)
end

-- The batch rule, restated: backend.Charged (internal/backend/backend.go) over the part of the
-- batch this call holds, with the quota threshold job.plan (decide.go) computed for it from the
-- rest. single and batch below apply it; TestScriptMatchesDecideBatch and
-- TestMergedBatchesMatchMemory (script_test.go) hold it equal to backend.DecideBatch.
--
-- charges says whether a call's part of a batch is charged: not when the batch was refused
-- before this call (threshold < 0), an enforced request is denied, or as many quota requests are
-- denied as the threshold says (> 0: every quota request of the batch not already denied is
-- here). A denial that refuses nothing (see refuses) counts as allowed.
local function charges(threshold, enforce_denied, quota_denied)
  return threshold >= 0 and not enforce_denied and not (threshold > 0 and quota_denied >= threshold)
end

-- emit_decision emits a DECISION record.
local function emit_decision(allowed, remaining, retry_us, reset_us)
  emit(pack(DECISION_FMT, allowed, remaining, retry_us, reset_us))
end

-- emit_charged emits the CHARGED record that begins a batch's reply.
local function emit_charged(charge)
  local charged = charge and 1 or 0
  emit(pack(CHARGED_FMT, charged, now))
end

-- emit_single emits a one-key batch's reply, its CHARGED and DECISION records, as one string.
local function emit_single(charge, allowed, remaining, retry_us, reset_us)
  local charged = charge and 1 or 0
  emit(pack(SINGLE_FMT, charged, now, allowed, remaining, retry_us, reset_us))
end

-- fast decides, as single does, a one-key batch of the common shape (FAST_FLAGS: an enforced
-- GCRA charge without overdraft) of cost >= 1 under L, on a key that holds no state or a GCRA
-- state written under L's rate and period, without tables: the state is read from its packed
-- value and written packed: the call's later batches read it from raw, and it is listed in put_*,
-- arrays, which cost less than the general path's tables keyed by name. It returns false, having
-- done nothing, for any other key (or one the general path decided before in this call), which
-- single then decides. TestFastPathMatchesGeneral holds it equal to the general path.
local function fast(key, L, cost, threshold)
  if states[key] ~= nil then
    return false
  end
  local v = raw[key]
  if v == nil then
    v = call("GET", key)
    raw[key] = v
  end
  local tus, tf -- the current TAT; nil when the key holds no usage
  if v then
    -- A GCRA state as parse reads it; any other value goes the general way.
    if #v ~= GCRA_STATE_BYTES or string.byte(v, GCRA_STATE_BYTES) <= 57 then
      return false
    end
    local tat, frac, rate, period = unpack(GCRA_STATE_FMT, v)
    if tat == ALG_SLIDING_LOG then
      return false -- parse would take it for a log
    end
    if not (tat < now or (tat == now and frac == 0)) then -- not fresh
      if rate ~= L.rate or period ~= L.period then
        return false -- another limit's terms
      end
      local hus, hf = sub(tat, frac, now, 0, rate)
      if less(L.most_us, L.most_frac, hus, hf) then
        hus, hf = L.most_us, L.most_frac
      end
      tus, tf = add(now, 0, hus, hf, rate)
    end
  end
  local ok, remaining, retry, reset, nus, nf
  if not tus and cost <= L.burst then
    ok, retry = 1, 0
    nus, nf, remaining, reset = charge_fresh(L, now, cost)
  else
    ok, remaining, retry, reset, nus, nf = gcra(L, now, tus or now, tf or 0, cost)
  end
  local charge = threshold >= 0 and ok == 1
  if charge then
    local tat, frac, rate, period = nus, nf, L.rate, L.period
    local nv = pack(GCRA_STATE_FMT, tat, frac, rate, period)
    -- The state expires at its reset (not fresh: cost >= 1), as store has it.
    local ttl = floor((reset + 999) / 1000)
    if fixed_now then
      ttl = ttl + 60000
    end
    raw[key] = nv
    nput = nput + 1
    put_keys[nput], put_ttls[nput], put_values[nput] = key, ttl, nv
  elseif ok == 1 then
    -- Allowed in a refused batch: a check of the state the batch found.
    if tus then
      local _
      _, remaining, _, reset = gcra(L, now, tus, tf, 0)
    else
      remaining, reset = L.burst, 0
    end
  end
  emit_single(charge, ok, remaining, retry, reset)
  return true
end

-- single decides a batch of one key, KEYS_[k0 + 1], as batch does, without its tables: most
-- batches are one descriptor under one limit.
local function single(k0, args, threshold)
  local key = KEYS_[k0 + 1]
  local rate, period, burst, cost, flags, wa, wb, wc = unpack(KEY_FMT, args)
  if flags == FAST_FLAGS and cost >= 1 and fast(key, limit_of(rate, period, burst, false, false), cost, threshold) then
    return 1
  end
  local refunds, mode, od, alg, shared = split(flags)
  local L = request_limit(rate, period, burst, od, alg, wa, wb, wc, now, shared)
  local s = state(key)
  local ns, ok, rem, retry, reset = apply(s, L, cost, refunds)
  local denied = ok == 0 and refuses(L, cost, refunds)
  local charge = charges(threshold, denied and mode == MODE_ENFORCE, (denied and mode == MODE_QUOTA) and 1 or 0)
  if charge then
    states[key] = ns
  elseif ok == 1 then
    -- Allowed in a refused batch: a check of the state the batch found.
    local _
    _, _, rem, _, reset = apply(s, L, 0, false)
  end
  emit_single(charge, ok, rem, retry, reset)
  return 1
end

-- batch decides the batch of n keys from KEYS_[k0 + 1] on, appending its reply to out.
local function batch(k0, args, threshold, multi)
  local n = #args / KEY_BYTES
  if n == 1 and not multi then
    return single(k0, args, threshold)
  end
  local cur, last, lim = {}, {}, {}
  local oks, rems, retries, resets = {}, {}, {}, {}
  local enforce_denied, quota_denied = false, 0
  local pos = 1
  for i = 1, n do
    local key = KEYS_[k0 + i]
    local rate, period, burst, cost, flags, wa, wb, wc
    rate, period, burst, cost, flags, wa, wb, wc, pos = unpack(KEY_FMT, args, pos)
    local refunds, mode, od, alg, shared = split(flags)
    local L = request_limit(rate, period, burst, od, alg, wa, wb, wc, now, shared)
    lim[i] = L
    local s = cur[key]
    if s == nil then
      s = state(key)
    end
    local ns, ok, rem, retry, reset = apply(s, L, cost, refunds)
    cur[key] = ns
    last[key] = i
    if ok == 0 and refuses(L, cost, refunds) then
      if mode == MODE_ENFORCE then
        enforce_denied = true
      elseif mode == MODE_QUOTA then
        quota_denied = quota_denied + 1
      end
    end
    oks[i], rems[i], retries[i], resets[i] = ok, rem, retry, reset
  end

  local charge = charges(threshold, enforce_denied, quota_denied)

  if not charge then
    -- Allowed requests of a refused batch report a check of the state the batch found.
    for i = 1, n do
      if oks[i] == 1 then
        local _
        _, _, rems[i], _, resets[i] = apply(states[KEYS_[k0 + i]], lim[i], 0, false)
      end
    end
  end
  emit_charged(charge)
  for i = 1, n do
    emit_decision(oks[i], rems[i], retries[i], resets[i])
  end
  if multi then
    for i = 1, n do
      local check_remaining, check_reset_us = 0, 0
      if oks[i] == 1 and charge then
        local _
        _, _, check_remaining, _, check_reset_us = apply(states[KEYS_[k0 + i]], lim[i], 0, false)
      end
      local key = KEYS_[k0 + i]
      local delta_us, delta_frac, delta_rate, delta_period, removed = 0, 0, 0, 0, nil
      if charge and last[key] == i then
        local L = lim[i]
        local a, b = cur[key], states[key]
        if L.alg then
          delta_us, delta_frac, removed = wdelta(b, a, L, now)
        elseif a and b and not a.alg and not b.alg and (a.rate ~= L.rate or a.period ~= L.period)
          and a.rate == b.rate and a.period == b.period then
          -- Refunds in the state's own terms (see refund): the change in those terms.
          local aus, af, bus, bf = a.tat, a.frac, b.tat, b.frac
          if less(aus, af, now, 0) then
            aus, af = now, 0
          end
          if less(bus, bf, now, 0) then
            bus, bf = now, 0
          end
          delta_us, delta_frac = sub(aus, af, bus, bf, a.rate)
          delta_rate, delta_period = a.rate, a.period
        else
          local aus, af = current(a, L, now)
          local bus, bf = current(b, L, now)
          delta_us, delta_frac = sub(aus, af, bus, bf, L.rate)
        end
      end
      local entries = removed and #removed / ENTRY_WORDS or 0
      emit(pack(MULTI_FMT, check_remaining, check_reset_us, delta_us, delta_frac, delta_rate, delta_period, entries))
      for j = 1, entries do
        local instant, hits = removed[2 * j - 1], removed[2 * j]
        emit(pack(ENTRY_FMT, instant, hits))
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

-- run runs one call: keys and argv are the KEYS and ARGV of contract.go. Under EVAL the script
-- ends by returning run(KEYS, ARGV); loaded as a library of Redis Functions it registers run,
-- and the definitions above are built once rather than on every call (see script.go).
local function run(keys, argv)
  if not call then
    bind()
    unpack = struct.unpack
  end
  KEYS_, ARGV_ = keys, argv
  now = clock(argv[ARG_NOW])
  local op = argv[ARG_OP]
  if op == OP_UNDO then
    return undo()
  elseif op == OP_GIVEBACK then
    return giveback()
  end
  states, stored, raw, out, nout = {}, {}, {}, {}, 0
  put_keys, put_ttls, put_values, nput = {}, {}, {}, 0
  if #keys > 1 then
    prefetch() -- a lone key is cheaper with GET
  end
  if op == OP_MERGED then
    -- Per batch its threshold, then its key records.
    local k0 = 0
    for b = ARG_MERGED, #argv, 2 do
      k0 = k0 + batch(k0, argv[b + 1], tonumber(argv[b]), false)
    end
  elseif op == OP_DECIDE then
    batch(0, argv[ARG_VALUES], tonumber(argv[ARG_THRESHOLD]), argv[ARG_MULTI] == "1")
  else
    error("rls: unknown operation " .. tostring(op))
  end
  -- The fast path's writes first, each key's last only (a hot key charged by many batches of
  -- the call is written once): raw holds it. A key the general path decided after them is
  -- written again below if that changed it.
  for i = 1, nput do
    local key, v = put_keys[i], put_values[i]
    if raw[key] == v then
      call("PSETEX", key, put_ttls[i], v)
    end
  end
  for key, s in pairs(states) do
    -- A key whose requests were all denied still holds its stored state: leave it alone.
    if s ~= stored[key] then
      store(key, s, stored[key] ~= false, now)
    end
  end
  local reply = table.concat(out)
  states, stored, raw, out = nil, nil, nil, nil
  put_keys, put_ttls, put_values = nil, nil, nil
  return reply
end
