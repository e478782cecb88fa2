package regions

import (
	"strconv"

	goredis "github.com/redis/go-redis/v9"
)

// The keys of the coordination store and of a region's store. Every key carries the hash tag
// {rls-global}, so that on a Redis Cluster they share a slot and each script sees all of them.
type keys struct {
	// The coordination store.
	coord, inbox, regions, keyStates string
	// A region's store.
	agent, seqBase, table, changes, meta string
	prefix                               string
}

func newKeys(prefix string) keys {
	p := prefix + "{rls-global}:"
	return keys{
		coord: p + "coordinator", inbox: p + "inbox", regions: p + "regions", keyStates: p + "keys",
		agent: p + "agent", seqBase: p + "seqbase", table: p + "table", changes: p + "changes", meta: p + "meta",
		prefix: p,
	}
}

func (k keys) reply(region string) string { return k.prefix + "reply:" + region }

func (k keys) demand(bucket int64) string {
	return k.prefix + "demand:" + itoa(bucket)
}

// leaseScript takes or keeps a role: KEYS[1] is the role's key, ARGV the holder's token and the
// role's lifetime in ms. It returns 1 when the token holds the role (taken now, or kept), 0 when
// another holds it.
var leaseScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
`)

// commitScript writes a coordinator's step, if it still holds the role: KEYS are the role, the
// regions' state, the keys' states, the inbox, then one reply list per reply. ARGV: the token,
// the reports taken from the inbox, the regions' state, the reply lists' lifetime in ms, the
// number of key states, then (key, state) pairs with state "" to forget, then the replies.
var commitScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[3])
local n = tonumber(ARGV[5])
local a = 6
for i = 1, n do
  local k, v = ARGV[a], ARGV[a + 1]
  if v == '' then
    redis.call('HDEL', KEYS[3], k)
  else
    redis.call('HSET', KEYS[3], k, v)
  end
  a = a + 2
end
redis.call('LTRIM', KEYS[4], tonumber(ARGV[2]), -1)
for i = 5, #KEYS do
  redis.call('RPUSH', KEYS[i], ARGV[a])
  redis.call('LTRIM', KEYS[i], -8, -1)
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
  a = a + 1
end
return 1
`)

// changeLog is how many changes of the table the log keeps: a replica further behind fetches
// the table whole.
const changeLog = 100000

// publishScript publishes a region's table, if the agent still holds the role: KEYS are the
// role, the table, its change log and its meta hash. ARGV: the token, the table's end on the
// store's clock (µs), then (key, "version rate burst") pairs; a share of nothing removes the
// key from the table (the log still names it). It returns the publication's number, or -1 when
// another holds the role. The log keeps the last changeLog changes; meta's floor is the
// publication before the oldest it keeps.
var publishScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local seq = redis.call('HINCRBY', KEYS[4], 'seq', 1)
for a = 3, #ARGV, 2 do
  local v = ARGV[a + 1]
  if string.match(v, '^%d+ 0 0$') or string.match(v, '^%d+ 0 0 %d+$') then
    redis.call('HDEL', KEYS[2], ARGV[a])
  else
    redis.call('HSET', KEYS[2], ARGV[a], v)
  end
  redis.call('ZADD', KEYS[3], seq, ARGV[a])
end
redis.call('HSET', KEYS[4], 'until', ARGV[2])
if redis.call('ZCARD', KEYS[3]) > ` + strconv.Itoa(changeLog) + ` then
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -` + strconv.Itoa(changeLog+1) + `)
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  redis.call('HSET', KEYS[4], 'floor', tonumber(oldest[2]) - 1)
end
return seq
`)

// fetchScript reads a region's table for a replica: KEYS are the table, its change log and its
// meta hash; ARGV[1] the publication the replica has (0: none). It returns the store's time
// (seconds, µs), the last publication's number, the table's end (µs), 1 when what follows is the
// whole table (the replica had none, or is behind the log) else 0, and the (key, entry) pairs
// published since ARGV[1].
var fetchScript = goredis.NewScript(`
local t = redis.call('TIME')
local meta = redis.call('HMGET', KEYS[3], 'seq', 'until', 'floor')
local since = tonumber(ARGV[1])
local whole = since == 0 or since < tonumber(meta[3] or '0') or since > tonumber(meta[1] or '0')
local out = {t[1], t[2], meta[1] or '0', meta[2] or '0', whole and '1' or '0'}
local changed
if whole then
  changed = redis.call('HKEYS', KEYS[1])
else
  changed = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. since, '+inf')
end
for j = 1, #changed, 1000 do
  local last = math.min(j + 999, #changed)
  local v = redis.call('HMGET', KEYS[1], unpack(changed, j, last))
  for i = j, last do
    out[#out + 1] = changed[i]
    out[#out + 1] = v[i - j + 1] or '0 0 0'
  end
end
return out
`)
