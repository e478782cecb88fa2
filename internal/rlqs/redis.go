package rlqs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Redis is a Store in Redis, shared by every replica that uses the same Redis and prefix: one
// hash per bucket, a field per proxy. Each Assign reads the hash, decides and writes back in one
// optimistic transaction (WATCH/MULTI/EXEC, retried on conflict), so replicas decide one after
// another from the same state and the shares they hand out never sum to more than the limit.
type Redis struct {
	rdb    goredis.UniversalClient
	prefix string
}

var (
	_ Store     = (*Redis)(nil)
	_ Announcer = (*Redis)(nil)
)

// NewRedis returns a Store on rdb, whose keys start with prefix. Close closes rdb.
func NewRedis(rdb goredis.UniversalClient, prefix string) *Redis {
	return &Redis{rdb: rdb, prefix: prefix}
}

// maxTxRetries bounds the attempts of one Assign against concurrent writers of the same bucket.
const maxTxRetries = 20

// errContended is returned when a bucket changed under every attempt.
var errContended = errors.New("rlqs: redis: bucket contended; try again")

// key is bucket's hash in Redis: named by the digest of its id, in hex, so that no client text
// is in a key (nor in a Cluster hash tag: a bucket is one key, which is one slot anyway).
func (r *Redis) key(bucket string) string {
	d := digest(bucket)
	return r.prefix + "rlqs:" + hex.EncodeToString(d[:])
}

// Assign implements Store.
func (r *Redis) Assign(ctx context.Context, bucket, proxy string, lim Budget, seen Seen, now, ttlMs int64) (Decision, error) {
	key := r.key(bucket)
	var d Decision
	txf := func(tx *goredis.Tx) error {
		raw, err := tx.HGetAll(ctx, key).Result()
		if err != nil {
			return err
		}
		b := decodeBucket(raw, now)
		before := b.budget
		b.advance(lim, now)
		gone := b.prune(now)
		if b.full(proxy, lim) {
			d = Decision{Refused: true}
			return nil
		}
		noted := b.note(proxy, seen, now)
		spent := b.budget
		d = b.decide(proxy, lim, now, ttlMs, seen.Report)
		if !noted && !d.Send && len(gone) == 0 && b.budget == spent && before.At != 0 {
			return nil // nothing handed out or forgotten: no write (the budget refills when read)
		}
		_, err = tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			if len(gone) > 0 {
				p.HDel(ctx, key, gone...)
			}
			p.HSet(ctx, key, proxy, encodeProxy(b.proxies[proxy]), budgetField, encodeBudget(b.budget))
			p.PExpire(ctx, key, ttlDuration(forgetAfterMs(lim, ttlMs)))
			return nil
		})
		return err
	}
	if err := r.transact(ctx, key, txf); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// Leave implements Store, in one round trip (leaveScript): a stream that ends may leave
// thousands of buckets, where an optimistic transaction of its own (WATCH, HGET, MULTI/EXEC)
// took four round trips and a connection held through them for each.
func (r *Redis) Leave(ctx context.Context, bucket, proxy string, now int64) error {
	if err := leaveScript.Run(ctx, r.rdb, []string{r.key(bucket)}, proxy).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("rlqs: redis: %w", err)
	}
	return nil
}

// leaveScript sets the seen-until of proxy's field (ARGV[1]) in a bucket's hash (KEYS[1]) to 0,
// so that the next Assign forgets the proxy once its hold has passed: a field of any other form
// than encodeProxy's five is left as it is, as Assign ignores it. It restates where encodeProxy
// puts SeenUntil (the second of its fields); TestLeaveScriptMatchesGo holds the two equal.
var leaveScript = goredis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local f = {}
for w in string.gmatch(v, '%S+') do f[#f + 1] = w end
if #f ~= 5 then return 0 end
f[2] = '0'
redis.call('HSET', KEYS[1], ARGV[1], table.concat(f, ' '))
return 1
`)

// transact runs txf on key in an optimistic transaction, again while another client changed key
// meanwhile, up to maxTxRetries times (then errContended).
func (r *Redis) transact(ctx context.Context, key string, txf func(*goredis.Tx) error) error {
	for range maxTxRetries {
		err := r.rdb.Watch(ctx, txf, key)
		if errors.Is(err, goredis.TxFailedErr) {
			continue
		}
		if err != nil {
			return fmt.Errorf("rlqs: redis: %w", err)
		}
		return nil
	}
	return errContended
}

// Peek implements Store.
func (r *Redis) Peek(ctx context.Context, bucket string) (map[string]proxyState, error) {
	raw, err := r.rdb.HGetAll(ctx, r.key(bucket)).Result()
	if err != nil {
		return nil, fmt.Errorf("rlqs: redis: %w", err)
	}
	out := map[string]proxyState{}
	for id, p := range decodeBucket(raw, 0).proxies {
		out[id] = *p
	}
	return out, nil
}

// Close implements Store.
func (r *Redis) Close() error { return r.rdb.Close() }

// channel is where the replicas announce shares released (PUBLISH reaches every node of a Cluster).
func (r *Redis) channel() string { return r.prefix + "rlqs:released" }

// Announce implements Announcer: one PUBLISH of from, the waiting proxies and bucket, a line each
// (ids have no newline; the bucket, last, may).
func (r *Redis) Announce(ctx context.Context, from, bucket string, waiting []string) error {
	if err := r.rdb.Publish(ctx, r.channel(), r.announcement(from, bucket, waiting)).Err(); err != nil {
		return fmt.Errorf("rlqs: redis: %w", err)
	}
	return nil
}

func (r *Redis) announcement(from, bucket string, waiting []string) string {
	var b strings.Builder
	b.WriteString(from)
	b.WriteByte('\n')
	for _, id := range waiting {
		b.WriteString(id)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	b.WriteString(bucket)
	return b.String()
}

// parseAnnouncement reads Announce's message.
func parseAnnouncement(m string) (from, bucket string, waiting []string, ok bool) {
	head, bucket, ok := strings.Cut(m, "\n\n")
	if !ok {
		return "", "", nil, false
	}
	ids := strings.Split(head, "\n")
	return ids[0], bucket, ids[1:], ids[0] != ""
}

// subscribeWait bounds how long Listen waits for Redis to confirm its subscription.
const subscribeWait = 2 * time.Second

// Listen implements Announcer with a subscription, which go-redis renews when its connection fails.
func (r *Redis) Listen(ctx context.Context, subscribed func(), fn func(from, bucket string, waiting []string)) {
	ps := r.rdb.Subscribe(ctx, r.channel())
	defer ps.Close()
	wctx, cancel := context.WithTimeout(ctx, subscribeWait)
	_, _ = ps.Receive(wctx) // the confirmation; on an error the channel below subscribes again
	cancel()
	subscribed()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			if from, bucket, waiting, ok := parseAnnouncement(m.Payload); ok {
				fn(from, bucket, waiting)
			}
		}
	}
}

// encodeProxy writes a proxy's state as "demand seenUntil rate burst holdUntil".
func encodeProxy(p *proxyState) string {
	return strconv.FormatFloat(p.Demand, 'g', -1, 64) + " " + strconv.FormatInt(p.SeenUntil, 10) + " " +
		strconv.FormatInt(p.Held.Rate, 10) + " " + strconv.FormatInt(p.Held.Burst, 10) + " " + strconv.FormatInt(p.HoldUntil, 10)
}

// decodeProxy reads encodeProxy's form; ok is false for anything else.
func decodeProxy(v string) (proxyState, bool) {
	f := strings.Fields(v)
	if len(f) != 5 {
		return proxyState{}, false
	}
	var p proxyState
	var errs [5]error
	p.Demand, errs[0] = strconv.ParseFloat(f[0], 64)
	p.SeenUntil, errs[1] = strconv.ParseInt(f[1], 10, 64)
	p.Held.Rate, errs[2] = strconv.ParseInt(f[2], 10, 64)
	p.Held.Burst, errs[3] = strconv.ParseInt(f[3], 10, 64)
	p.HoldUntil, errs[4] = strconv.ParseInt(f[4], 10, 64)
	if errors.Join(errs[:]...) != nil || p.Demand < 0 || p.Held.Rate < 0 || p.Held.Burst < 0 {
		return proxyState{}, false
	}
	return p, true
}

// budgetField is the field of a bucket's hash that holds its budget; proxy ids never start with "~".
const budgetField = "~budget"

// encodeBudget writes a budget as "milli at".
func encodeBudget(g budget) string {
	return strconv.FormatInt(g.Milli, 10) + " " + strconv.FormatInt(g.At, 10)
}

// decodeBudget reads encodeBudget's form; ok is false for anything else.
func decodeBudget(v string) (budget, bool) {
	f := strings.Fields(v)
	if len(f) != 2 {
		return budget{}, false
	}
	milli, err1 := strconv.ParseInt(f[0], 10, 64)
	at, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || milli < 0 || at <= 0 {
		return budget{}, false
	}
	return budget{Milli: milli, At: at}, true
}

// decodeBucket reads a bucket's hash. A field it cannot read is dropped, and a proxy whose hold
// it cannot read holds nothing: the hash is written only by rls, so this is a foreign key. A
// budget it cannot read is empty as of now, which hands out nothing until it refills.
func decodeBucket(raw map[string]string, now int64) *bucketState {
	b := &bucketState{proxies: make(map[string]*proxyState, len(raw))}
	for id, v := range raw {
		if id == budgetField {
			g, ok := decodeBudget(v)
			if !ok {
				g = budget{At: now}
			}
			b.budget = g
			continue
		}
		if p, ok := decodeProxy(v); ok {
			b.proxies[id] = &p
		}
	}
	return b
}
