-- Limits on requests in flight (backend.DecideSlot, internal/backend/concurrency.go) on one
-- key, a sorted set: member the slot id, score the instant (µs) it frees itself. Called once
-- per request, in the batch's order; a key is written only by these two scripts.
--
-- KEYS[1] the key. ARGV: op, now (µs; 0: Redis TIME), max_in_flight, lifetime (µs), slot id,
-- and for op "u" the score to restore (-1: none).
--   "a" acquires (or renews) the slot, "r" releases it, "c" checks;
--   "u" undoes what an "a" or "r" of a refused batch wrote.
-- The reply of a, r and c: {allowed, remaining, retry_us, reset_us, free_before, reset_before_us,
-- prev, written, expired}: the decision; the key as the call found it (slots free, µs until all
-- free); the slot's score before the call (-1: not held); 1 when the call wrote; the expired
-- slots it dropped. Expired slots are dropped first, so a key never holds more than
-- max_in_flight members.
local key = KEYS[1]
local op, now, n, life, id = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if now == 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local expired = redis.call("ZREMRANGEBYSCORE", key, "-inf", now)

local function latest()
  local r = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")
  if r[2] then
    return tonumber(r[2])
  end
  return now
end

-- expire makes the key leave with its last slot's expiry, top.
local function expire(top)
  if top > now then
    redis.call("PEXPIRE", key, math.floor((top - now) / 1000) + 1000)
  end
end

local prev = redis.call("ZSCORE", key, id)
if prev then
  prev = tonumber(prev)
else
  prev = -1
end

if op == "u" then
  local restore = tonumber(ARGV[6])
  if restore < 0 then
    redis.call("ZREM", key, id)
  elseif prev >= 0 then
    redis.call("ZADD", key, "XX", restore, id)
  elseif restore > now and redis.call("ZCARD", key) < n then
    redis.call("ZADD", key, restore, id) -- a release undone, while there is room
  end
  expire(latest())
  return 0
end

local held = redis.call("ZCARD", key)
local top = latest()
local free_before, reset_before = math.max(n - held, 0), top - now
local allowed, written, retry = 1, 0, 0
if op == "r" then
  if prev >= 0 then
    redis.call("ZREM", key, id)
    held = held - 1
    written = 1
    if prev >= top then
      top = latest()
    end
  end
elseif op == "c" then
  if prev < 0 and held >= n then
    allowed = 0
  end
elseif id ~= "" and (prev >= 0 or held < n) then
  redis.call("ZADD", key, now + life, id)
  if prev < 0 then
    held = held + 1
  end
  written = 1
  if now + life >= top then
    top = now + life
  elseif prev >= top then
    top = latest() -- the last to expire renewed under a shorter lifetime
  end
  expire(top)
else
  allowed = 0
end
if allowed == 0 then
  local first = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
  if first[2] then
    retry = math.max(tonumber(first[2]) - now, 1)
  else
    retry = 1
  end
end
return {allowed, math.max(n - held, 0), retry, top - now, free_before, reset_before, prev, written, expired}
