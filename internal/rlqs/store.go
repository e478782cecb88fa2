package rlqs

import (
	"context"
	"crypto/sha256"
	"maps"
	"slices"
	"sync"
)

// Store keeps the bucket states that shares are computed from. Memory serves one replica;
// Redis lets replicas divide one limit.
type Store interface {
	// Assign records what seen says of proxy's demand for bucket (see Seen) and decides its
	// share (see bucketState.decide). Times are Unix ms.
	Assign(ctx context.Context, bucket, proxy string, lim Budget, seen Seen, now, ttlMs int64) (Decision, error)
	// Leave stops counting proxy's demand for bucket; what it holds stays held until it expires,
	// since the proxy may go on enforcing it that long.
	Leave(ctx context.Context, bucket, proxy string, now int64) error
	// Peek returns a copy of bucket's state.
	Peek(ctx context.Context, bucket string) (map[string]proxyState, error)
	Close() error
}

// Seen is what a stream knows of its proxy's demand for a bucket.
type Seen struct {
	Demand float64 // requests per second, allowed and denied
	Until  int64   // when it stops counting: the report's instant plus the TTL
	// Report says the proxy has just reported it: it is recorded and the proxy is answered.
	// Otherwise (a tick) it is recorded only when the store has no record of the proxy while
	// the report still counts: the store lost its state (Redis flushed, restarted, or down
	// when the report came), and the proxy would otherwise count as wanting nothing.
	Report bool
}

// Announcer is a Store shared by replicas that also carries word of shares released: a replica
// announces the buckets where a proxy's share shrank, and every replica listening wakes its own
// proxies of the bucket, which would otherwise take the room at their next tick.
type Announcer interface {
	// Announce tells the replicas listening that replica from released room in bucket, which the
	// proxies waiting may take.
	Announce(ctx context.Context, from, bucket string, waiting []string) error
	// Listen calls fn with every announcement, its own too, until ctx ends. It keeps listening
	// through connection failures. It calls subscribed once, soon: when announcements made from
	// then on reach fn, or when it gave up waiting for that (they will reach fn once it can).
	Listen(ctx context.Context, subscribed func(), fn func(from, bucket string, waiting []string))
}

// Memory is a Store in this process. It is safe for concurrent use.
//
// Buckets are kept by a digest of their id (see digest), so that what a bucket leaves behind
// once its streams end (holds until they expire, a budget still refilling) is a few dozen bytes
// whatever the size of its id.
type Memory struct {
	mu        sync.Mutex
	buckets   map[[digestSize]byte]*bucketState
	lastSweep int64
	// maxKept, when not 0, bounds the buckets kept: past it, each sweep forgets buckets that
	// no proxy counts in or holds anything of (their spent budgets: each then has its whole
	// burst again, which a bucket seen for the first time has anyway), so that streams that
	// come and go with new ids cannot grow the store for as long as a budget takes to refill.
	maxKept int
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store.
func NewMemory() *Memory { return &Memory{buckets: map[[digestSize]byte]*bucketState{}} }

// digestSize is the bytes of a bucket id's digest: 128 bits of SHA-256.
const digestSize = 16

// digest is what the stores keep a bucket by: its id's SHA-256, cut to digestSize bytes, so
// that no client text is kept in the store or put in a Redis key.
func digest(bucket string) [digestSize]byte {
	sum := sha256.Sum256([]byte(bucket))
	return [digestSize]byte(sum[:digestSize])
}

// Assign implements Store.
func (m *Memory) Assign(_ context.Context, bucket, proxy string, lim Budget, seen Seen, now, ttlMs int64) (Decision, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweepLocked(now)
	k := digest(bucket)
	b := m.buckets[k]
	if b == nil {
		b = newBucketState()
		m.buckets[k] = b
	}
	b.advance(lim, now)
	b.prune(now)
	if b.full(proxy, lim) {
		return Decision{Refused: true}, nil
	}
	b.note(proxy, seen, now)
	return b.decide(proxy, lim, now, ttlMs, seen.Report), nil
}

// Leave implements Store.
func (m *Memory) Leave(_ context.Context, bucket, proxy string, now int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweepLocked(now)
	k := digest(bucket)
	b := m.buckets[k]
	if b == nil {
		return nil
	}
	if p := b.proxies[proxy]; p != nil {
		p.SeenUntil = 0
	}
	b.advance(b.lim, now)
	b.prune(now)
	if b.empty(now) {
		delete(m.buckets, k)
	}
	return nil
}

// sweepInterval is how often, at most, Memory looks over every bucket for what to forget.
const sweepInterval = 1000 // ms

// sweepLocked forgets, at most every sweepInterval, the proxies and buckets that hold nothing
// and count for nothing at now (a bucket once its budget has refilled). m.mu must be held.
func (m *Memory) sweepLocked(now int64) {
	if now-m.lastSweep < sweepInterval {
		return
	}
	m.lastSweep = now
	m.sweepAllLocked(now)
}

// Sweep forgets the proxies and buckets that hold nothing and count for nothing at now.
func (m *Memory) Sweep(now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweepAllLocked(now)
}

func (m *Memory) sweepAllLocked(now int64) {
	for k, b := range m.buckets {
		b.advance(b.lim, now)
		if b.prune(now); b.empty(now) {
			delete(m.buckets, k)
		}
	}
	if m.maxKept <= 0 {
		return
	}
	for k, b := range m.buckets {
		if len(m.buckets) <= m.maxKept {
			break
		}
		if len(b.proxies) == 0 {
			delete(m.buckets, k)
		}
	}
}

// Len is the number of buckets kept.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.buckets)
}

// Peek implements Store.
func (m *Memory) Peek(_ context.Context, bucket string) (map[string]proxyState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]proxyState{}
	if b := m.buckets[digest(bucket)]; b != nil {
		for id, p := range b.proxies {
			out[id] = *p
		}
	}
	return out, nil
}

// Close implements Store.
func (m *Memory) Close() error { return nil }

// sortedIDs returns the keys of a state, sorted.
func sortedIDs(m map[string]proxyState) []string { return slices.Sorted(maps.Keys(m)) }
