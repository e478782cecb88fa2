-- GCRA for rls, the same arithmetic as internal/backend/gcra.go, in one atomic call.
--
-- Time is integer microseconds from Redis TIME, so every replica of rls agrees on it. A TAT is
-- exact: us + frac/rate microseconds with 0 <= frac < rate, stored per key as the string
-- "tat frac rate period" with an expiry at the reset, when the key holds no usage any more.
--
-- Lua numbers here are doubles: integers are exact only below 2^53. The bounds that keep every
-- intermediate below 2^53, given limits that backend.Limit.Validate accepts (rate and burst
-- <= 2^32, period and burst*period/rate <= 100 years = 3.16e15 us < 2^52):
--   * interval(n) = n*period/rate never forms n*period (up to 2^84): period is split into
--     pq*rate + pr, and when n*pr reaches 2^53, n into 16-bit halves, so that no product
--     exceeds 2^49;
--   * count(d) = floor(d/T) is estimated in floating point, off by at most one since the
--     result is below 2^34 (relative error 2^-51), and corrected with exact comparisons;
--   * divmod corrects a float quotient that rounded to the next integer (possible only for
--     a dividend near 2^53, which the bounds above never reach; kept as a guard).
-- TestScriptMatchesGo compares this script with the Go functions on random states and limits
-- across these ranges.
--
-- ARGV[1] is the operation. Per-key values travel as one string of little-endian doubles per
-- batch (5 per key), unpacked in one call: converting ARGV strings one by one is a large part of
-- a call's cost. Every value sent is an integer below 2^53, so exact as a double.
--   "d" decide: ARGV[2] now (0: use TIME; tests pass a fixed instant), ARGV[3] when to refuse
--       the batch for its quota requests (k > 0: when k quota requests here are denied, which
--       are then every quota request of the batch not already denied; 0: never; -1: refused
--       already), ARGV[4] 1 when other script calls hold part of the batch, ARGV[5] per key i:
--       rate, period (us), burst, cost (clamped to [0, burst+1]), flags (1 refund, + 2*mode
--       with mode 0 enforce, 1 shadow, 2 quota). Rate is > 0: rls decides rate 0 itself. A key
--       repeated in the batch sees the earlier charges; charges are written only when the batch
--       is not refused here. Returns {charged, 4 values per key: allowed, remaining, retry_us,
--       reset_us}; with ARGV[4] = 1 also, per key, the check-only remaining and reset_us and the
--       exact change written (delta_us, delta_frac in 1/rate us, zero but on a key's last
--       occurrence).
--   "m" several batches, each decided as by "d" with ARGV[4] = 0, in order, as one call each
--       would: a key in several batches sees the charges of the earlier batches that were not
--       refused. ARGV[2] now, then per batch its quota threshold and its per-key string; KEYS
--       are the batches' keys in order. Returns the replies of "d", concatenated. This spares
--       the fixed cost of a script call (and TIME) per batch when concurrent calls coalesce.
--   "u" undo: ARGV[2] now, ARGV[3] per key: rate, period, burst, delta_us, delta_frac: subtracts
--       a change written by "d" (a batch that another node denied), within [now, now + burst].
--
-- A key stores its state as the text "tat frac rate period": readable with GET when debugging,
-- and no slower to parse than a binary form was when measured.

local MAX_TOLERANCE = 100 * 365 * 24 * 3600 * 1000000
local TWO53 = 9007199254740992
local floor = math.floor
local unpack = struct.unpack
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
-- full_us, full_frac}, where period = pq*rate + pr, so that one emission interval is (pq, pr),
-- and a full burst is (full_us, full_frac).
local function limit(rate, period, burst)
  local pq, pr = divmod(period, rate)
  local L = {rate, period, burst, pq, pr, 0, 0}
  L[6], L[7] = interval(burst, L)
  return L
end

-- count returns floor(d/T) for a span d >= 0 of fewer than 2^34 emission intervals.
local function count(dus, df, L)
  local n = floor((dus * L[1] + df) / L[2])
  if n < 0 then
    n = 0
  end
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
  return not s or s[1] < now or (s[1] == now and s[2] == 0)
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
    if dus * orate / operiod > 8589934592 then
      return now, 0 -- more than 2^33 intervals: no limit rls accepts wrote this
    end
    local O = limit(orate, operiod, 1)
    local n = count(dus, df, O)
    local ius, ifr = interval(n, O)
    if less(ius, ifr, dus, df) then
      n = n + 1
    end
    if n > L[3] then
      n = L[3]
    end
    hus, hf = interval(n, L)
  end
  if less(L[6], L[7], hus, hf) then
    hus, hf = L[6], L[7]
  end
  return add(now, 0, hus, hf, rate)
end

-- decide is gcra.go's Decide: the new state (s itself when denied) and the decision.
local function decide(s, L, now, cost)
  local rate = L[1]
  local tus, tf = current(s, L, now)
  local aus, af = add(now, 0, L[6], L[7], rate)
  local hus, hf = sub(aus, af, tus, tf, rate)
  local remaining = count(hus, hf, L)
  if cost > L[3] then
    local reset = ceil_us(sub(tus, tf, now, 0, rate))
    return s, 0, remaining, reset, reset
  end
  if cost < 0 then
    cost = 0
  end
  local cus, cf = interval(cost, L)
  local nus, nf = add(tus, tf, cus, cf, rate)
  local wus, wf = sub(nus, nf, L[6], L[7], rate)
  if less(now, 0, wus, wf) then
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

local function load(key)
  local v = redis.call("GET", key)
  if not v then
    return false
  end
  local a, b, c, d = string.match(v, "^(%-?%d+) (%d+) (%d+) (%d+)$")
  if not a then
    return false
  end
  return {tonumber(a), tonumber(b), tonumber(c), tonumber(d)}
end

local function store(key, s, existed, now)
  if fresh(s, now) then
    if existed then
      redis.call("DEL", key)
    end
    return
  end
  -- Expire at the reset, rounded up to whole milliseconds: the state is then no usage at all.
  -- A fixed now (tests) is not Redis's clock: keep such keys a minute longer than the test.
  local ttl = floor((ceil_us(sub(s[1], s[2], now, 0, s[3])) + 999) / 1000)
  if fixed_now then
    ttl = ttl + 60000
  end
  redis.call("SET", key, string.format("%d %d %d %d", s[1], s[2], s[3], s[4]), "PX", ttl)
end

local function clock(arg)
  local now = tonumber(arg)
  fixed_now = now ~= 0
  if now == 0 then
    local t = redis.call("TIME")
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- The last limit built, reused while the keys that follow share it, as they usually do.
local last_rate, last_period, last_burst, last_limit
local function limit_of(rate, period, burst)
  if rate ~= last_rate or period ~= last_period or burst ~= last_burst then
    last_rate, last_period, last_burst = rate, period, burst
    last_limit = limit(rate, period, burst)
  end
  return last_limit
end

local op = ARGV[1]
local now = clock(ARGV[2])

if op == "u" then
  local args, pos = ARGV[3], 1
  for i = 1, #KEYS do
    local rate, period, burst, dus, df
    rate, period, burst, dus, df, pos = unpack("<ddddd", args, pos)
    local L = limit_of(rate, period, burst)
    local s = load(KEYS[i])
    local tus, tf = current(s, L, now)
    tus, tf = sub(tus, tf, dus, df, rate)
    if less(tus, tf, now, 0) then
      tus, tf = now, 0
    end
    local mus, mf = add(now, 0, L[6], L[7], rate)
    if less(mus, mf, tus, tf) then
      tus, tf = mus, mf
    end
    store(KEYS[i], {tus, tf, rate, L[2]}, s ~= false, now)
  end
  return 1
end

-- states holds per key the state after the batches of this call charged so far, stored the
-- state before them: only keys whose state changed are written, once, at the end.
local states, stored = {}, {}

local function state(key)
  local s = states[key]
  if s == nil then
    s = load(key)
    states[key], stored[key] = s, s
  end
  return s
end

-- batch decides the batch of n keys from KEYS[k0 + 1] on, appending its reply to res.
local function batch(k0, args, quota_refuse, multi, res)
  local n = #args / 40
  local r0 = #res
  res[r0 + 1] = 0
  local cur, last, lim, allowed = {}, {}, {}, {}
  local enforce_denied, quota_denied = false, 0
  local pos = 1
  for i = 1, n do
    local key = KEYS[k0 + i]
    local rate, period, burst, cost, flags
    rate, period, burst, cost, flags, pos = unpack("<ddddd", args, pos)
    local L = limit_of(rate, period, burst)
    lim[i] = L
    local s = cur[key]
    if s == nil then
      s = state(key)
    end
    local ns, ok, rem, retry, reset
    if flags % 2 == 1 then
      ns, ok, rem, retry, reset = refund(s, L, now, cost)
    else
      ns, ok, rem, retry, reset = decide(s, L, now, cost)
    end
    cur[key] = ns
    last[key] = i
    allowed[i] = ok
    if ok == 0 then
      local mode = floor(flags / 2)
      if mode == 0 then
        enforce_denied = true
      elseif mode == 2 then
        quota_denied = quota_denied + 1
      end
    end
    local o = r0 + 4 * i - 2
    res[o], res[o + 1], res[o + 2], res[o + 3] = ok, rem, retry, reset
  end

  -- The batch is refused here when an enforced request is denied, or the quota requests that
  -- were left to deny it are, or it was refused before this call.
  local charge = quota_refuse >= 0 and not enforce_denied and not (quota_refuse > 0 and quota_denied >= quota_refuse)

  if not charge then
    -- Allowed requests of a refused batch report a check of the state the batch found.
    for i = 1, n do
      if allowed[i] == 1 then
        local _, _, rem, _, reset = decide(states[KEYS[k0 + i]], lim[i], now, 0)
        local o = r0 + 4 * i - 2
        res[o + 1], res[o + 3] = rem, reset
      end
    end
  end
  if multi then
    for i = 1, n do
      local rem, reset = 0, 0
      if allowed[i] == 1 and charge then
        local _
        _, _, rem, _, reset = decide(states[KEYS[k0 + i]], lim[i], now, 0)
      end
      res[#res + 1] = rem
      res[#res + 1] = reset
    end
    for i = 1, n do
      local key = KEYS[k0 + i]
      local dus, df = 0, 0
      if charge and last[key] == i then
        local L = lim[i]
        local aus, af = current(cur[key], L, now)
        local bus, bf = current(states[key], L, now)
        dus, df = sub(aus, af, bus, bf, L[1])
      end
      res[#res + 1] = dus
      res[#res + 1] = df
    end
  end
  if charge then
    res[r0 + 1] = 1
    for key in pairs(last) do
      states[key] = cur[key]
    end
  end
  return n
end

local res = {}
if op == "m" then
  local k0 = 0
  for b = 3, #ARGV, 2 do
    k0 = k0 + batch(k0, ARGV[b + 1], tonumber(ARGV[b]), false, res)
  end
else
  batch(0, ARGV[5], tonumber(ARGV[3]), ARGV[4] == "1", res)
end

for key, s in pairs(states) do
  -- A key whose requests were all denied still holds its stored state: leave it alone.
  if s ~= stored[key] then
    store(key, s, stored[key] ~= false, now)
  end
end
return res
