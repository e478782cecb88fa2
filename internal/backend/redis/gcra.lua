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
-- ARGV[1] is the operation:
--   "d" decide: ARGV[2] now (0: use TIME; tests pass a fixed instant), ARGV[3] when to refuse
--       the batch for its quota requests (k > 0: when k quota requests here are denied, which
--       are then every quota request of the batch not already denied; 0: never; -1: refused
--       already), ARGV[4] 1 when other script calls hold part of the batch, then per key i five
--       values: rate, period (us), burst, cost, flags (1 refund, + 2*mode with mode 0 enforce,
--       1 shadow, 2 quota). Rate is > 0: rls decides rate 0 itself. A key repeated in the batch
--       sees the earlier charges; charges are written only when the batch is not refused here.
--       Returns {charged, 4 values per key: allowed, remaining, retry_us, reset_us}; with
--       ARGV[4] = 1 also, per key, the check-only remaining and reset_us and the exact change
--       written (delta_us, delta_frac in 1/rate us, zero but on a key's last occurrence).
--   "u" undo: ARGV[2] now, then per key rate, period, burst, delta_us, delta_frac: subtracts a
--       change written by "d" (a batch that another node denied), within [now, now + burst].

local MAX_TOLERANCE = 100 * 365 * 24 * 3600 * 1000000
local TWO53 = 9007199254740992
local floor = math.floor
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

local function fresh(s, now)
  return s == nil or s[1] < now or (s[1] == now and s[2] == 0)
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
    return nil
  end
  local a, b, c, d = string.match(v, "^(%-?%d+) (%d+) (%d+) (%d+)$")
  if not a then
    return nil
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

local op = ARGV[1]
local now = clock(ARGV[2])

if op == "u" then
  for i = 1, #KEYS do
    local o = 2 + (i - 1) * 5
    local L = limit(tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]))
    local s = load(KEYS[i])
    local tus, tf = current(s, L, now)
    tus, tf = sub(tus, tf, tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5]), L[1])
    if less(tus, tf, now, 0) then
      tus, tf = now, 0
    end
    local mus, mf = add(now, 0, L[6], L[7], L[1])
    if less(mus, mf, tus, tf) then
      tus, tf = mus, mf
    end
    store(KEYS[i], {tus, tf, L[1], L[2]}, s ~= nil, now)
  end
  return 1
end

local quota_refuse, multi = tonumber(ARGV[3]), ARGV[4] == "1"
local n = #KEYS
local base, cur, last = {}, {}, {}
local res = {0}
local lim, allowed = {}, {}
local enforce_denied, quota_denied = false, 0
for i = 1, n do
  local o = 4 + (i - 1) * 5
  local key = KEYS[i]
  local L = limit(tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]))
  local cost, flags = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
  local mode = floor(flags / 2)
  lim[i] = L
  if base[key] == nil then
    local s = load(key)
    base[key] = s or false
    cur[key] = s or false
  end
  local s = cur[key] or nil
  local ns, ok, rem, retry, reset
  if flags % 2 == 1 then
    ns, ok, rem, retry, reset = refund(s, L, now, cost)
  else
    ns, ok, rem, retry, reset = decide(s, L, now, cost)
  end
  cur[key] = ns or false
  last[key] = i
  allowed[i] = ok
  if ok == 0 then
    if mode == 0 then
      enforce_denied = true
    elseif mode == 2 then
      quota_denied = quota_denied + 1
    end
  end
  res[#res + 1] = ok
  res[#res + 1] = rem
  res[#res + 1] = retry
  res[#res + 1] = reset
end

-- The batch is refused here when an enforced request is denied, or the quota requests that
-- were left to deny it are, or it was refused before this call.
local charge = quota_refuse >= 0 and not enforce_denied and not (quota_refuse > 0 and quota_denied >= quota_refuse)

local function check_only(i)
  local _, _, rem, _, reset = decide(base[KEYS[i]] or nil, lim[i], now, 0)
  return rem, reset
end

if charge then
  res[1] = 1
  for key in pairs(last) do
    -- A key whose requests were all denied still holds its stored state: leave it alone.
    if cur[key] ~= base[key] then
      store(key, cur[key] or nil, base[key] ~= false, now)
    end
  end
else
  for i = 1, n do
    if allowed[i] == 1 then
      local rem, reset = check_only(i)
      res[2 + (i - 1) * 4 + 1] = rem
      res[2 + (i - 1) * 4 + 3] = reset
    end
  end
end

if multi then
  for i = 1, n do
    local rem, reset = 0, 0
    if allowed[i] == 1 and charge then
      rem, reset = check_only(i)
    end
    res[#res + 1] = rem
    res[#res + 1] = reset
  end
  for i = 1, n do
    local key = KEYS[i]
    local dus, df = 0, 0
    if charge and last[key] == i then
      local L = lim[i]
      local aus, af = current(cur[key] or nil, L, now)
      local bus, bf = current(base[key] or nil, L, now)
      dus, df = sub(aus, af, bus, bf, L[1])
    end
    res[#res + 1] = dus
    res[#res + 1] = df
  end
end
return res
