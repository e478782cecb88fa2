package backend

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// MemoryOptions configures a Memory backend. The zero value is usable.
type MemoryOptions struct {
	// MaxBytes bounds the memory the keys take (default 256 MiB): each key counts its length
	// plus a measured overhead of 112 bytes, so the default holds about 2M keys of 22 bytes or
	// 64k keys of 4 KB. Past it the least recently used keys are forgotten; see Memory for what
	// that does to accuracy. It bounds the live heap of the keys; the process's resident memory
	// is above it by the garbage collector's headroom (GOGC) and the allocator's fragmentation:
	// measured at 3M keys of 22 bytes, 280 MB resident after a GC for the default bound (peak
	// 364 MB), and at 1M keys of 4 KB, 432 MB (peak 618 MB).
	MaxBytes int64
	// MaxKeys, when > 0, bounds the number of keys as well.
	MaxKeys int
	// Shards is the number of independently locked partitions (default 64, fewer when MaxBytes
	// is too small to give each at least 64 short keys). Each holds MaxBytes/Shards.
	Shards int
	// Now is the clock (default time.Now). Tests pass a fake.
	Now func() time.Time
}

// DefaultMemoryMaxBytes is MemoryOptions.MaxBytes when unset.
const DefaultMemoryMaxBytes = 256 << 20

// Memory is a Backend that keeps its keys' state in this process: exact for one replica, shared by
// nothing. It is safe for concurrent use. It decides each batch with DecideBatch under the locks
// of the shards its keys fall in, and stores what DecideBatch says. State is sharded by key
// hash, each shard a least-recently-used list bounded by MaxBytes/Shards (and MaxKeys/Shards),
// and a key is dropped once it is back to a full burst (its state is then the same as no state
// at all), lazily: the oldest entries of a shard are checked on each decision.
//
// Eviction and accuracy: a key evicted while it still holds usage is forgotten, and its next
// request sees a full burst: each such eviction can over-admit up to Burst requests for that
// key, never under-admit. Evictions happen only when the keys holding usage at once take more
// than MaxBytes (or number more than MaxKeys); Evictions counts them. To keep decisions exact,
// size MaxBytes above (key length + 112 bytes) × the keys active within the longest period of
// the limits, and watch Evictions stay at 0.
type Memory struct {
	seed      maphash.Seed
	shards    []memShard
	now       func() time.Time
	pool      sync.Pool // *scratch
	evictions atomic.Uint64
	expired   atomic.Uint64 // slots found expired (SlotStats)
}

type memShard struct {
	mu sync.Mutex
	t  lruTable
	_  [64]byte // keep shards' locks on separate cache lines
}

// scratch holds a decision's working state so that steady-state decisions allocate nothing.
type scratch struct {
	hash   []uint64
	entry  []int32 // the key's entry in its shard, 0 if none
	locked []int
	states []State
	next   []State
}

var (
	_ Backend  = (*Memory)(nil)
	_ Resetter = (*Memory)(nil)
)

// NewMemory returns a Memory backend.
func NewMemory(opts MemoryOptions) (*Memory, error) {
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMemoryMaxBytes
	}
	if opts.Shards == 0 {
		opts.Shards = 64
	}
	if opts.MaxBytes < entryOverhead || opts.MaxKeys < 0 || opts.Shards < 0 {
		return nil, fmt.Errorf("memory backend: max bytes %d must be ≥ %d, max keys %d ≥ 0 and shards %d > 0",
			opts.MaxBytes, entryOverhead, opts.MaxKeys, opts.Shards)
	}
	// Give each shard room for at least 64 short keys (and one key under MaxKeys).
	opts.Shards = int(min(int64(opts.Shards), max(1, opts.MaxBytes/(64*(entryOverhead+32)))))
	if opts.MaxKeys > 0 {
		opts.Shards = min(opts.Shards, opts.MaxKeys)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Memory{seed: maphash.MakeSeed(), shards: make([]memShard, opts.Shards), now: opts.Now}
	perBytes := opts.MaxBytes / int64(opts.Shards)
	perKeys := 0
	if opts.MaxKeys > 0 {
		perKeys = (opts.MaxKeys + opts.Shards - 1) / opts.Shards
	}
	for i := range m.shards {
		m.shards[i].t = newLRUTable(m.seed, perBytes, perKeys)
	}
	m.pool.New = func() any { return new(scratch) }
	return m, nil
}

var _ MemoryStats = (*Memory)(nil)

// Len returns the number of keys held.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.t.n
		s.mu.Unlock()
	}
	return n
}

// Bytes returns the memory the keys held take, as counted against MaxBytes.
func (m *Memory) Bytes() int64 {
	n := int64(0)
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.t.bytes
		s.mu.Unlock()
	}
	return n
}

// Evictions returns how many keys were forgotten to stay within the bounds while they still
// held usage: each may have over-admitted up to its burst.
func (m *Memory) Evictions() uint64 { return m.evictions.Load() }

// Purge forgets every key and releases the memory they took.
func (m *Memory) Purge() {
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		s.t = newLRUTable(m.seed, s.t.maxBytes, s.t.maxKeys)
		s.mu.Unlock()
	}
}

// Close implements Backend.
func (m *Memory) Close() error { return nil }

// Decide implements Backend.
func (m *Memory) Decide(_ context.Context, reqs []Request, out []Decision) (bool, error) {
	if len(out) < len(reqs) {
		return false, fmt.Errorf("memory backend: %d decisions for %d requests", len(out), len(reqs))
	}
	for i := range reqs {
		if r := reqs[i].Limit.Rate; r < 0 || r > 1<<32 {
			return false, fmt.Errorf("memory backend: %w: rate %d of key %q outside [0, 2^32]", limit.ErrInvalid, r, reqs[i].Key)
		}
	}
	now := m.now().UnixMicro()
	sc := m.pool.Get().(*scratch)
	defer m.pool.Put(sc)
	n := len(reqs)
	sc.hash = slices.Grow(sc.hash[:0], n)[:n]
	sc.entry = slices.Grow(sc.entry[:0], n)[:n]
	sc.states = slices.Grow(sc.states[:0], n)[:n]
	sc.next = slices.Grow(sc.next[:0], n)[:n]
	sc.locked = sc.locked[:0]
	for i := range reqs {
		sc.hash[i] = maphash.String(m.seed, reqs[i].Key)
		if s := m.shardOf(sc.hash[i]); !slices.Contains(sc.locked, s) {
			sc.locked = append(sc.locked, s)
		}
	}
	// Lock in ascending order so that concurrent batches cannot deadlock.
	slices.Sort(sc.locked)
	for _, s := range sc.locked {
		m.shards[s].mu.Lock()
	}
	defer func() {
		for _, s := range sc.locked {
			m.shards[s].mu.Unlock()
		}
	}()

	for i := range reqs {
		t := &m.shards[m.shardOf(sc.hash[i])].t
		sc.entry[i] = t.lookup(sc.hash[i], reqs[i].Key)
		sc.states[i] = State{}
		if sc.entry[i] != 0 {
			sc.states[i] = t.entries[sc.entry[i]].state()
		}
	}
	charged := DecideBatch(sc.states, reqs, now, out, sc.next)
	if charged && HoldsSlots(reqs) && Admitted(reqs, out) {
		m.countExpired(reqs, sc.states, now)
	}
	if charged {
		// Keys held already first: their entries stay where lookup found them until the keys
		// not held yet are added, which may evict.
		for i := range reqs {
			if sc.entry[i] == 0 || m.repeatedLater(reqs, sc.hash, i) {
				continue
			}
			t := &m.shards[m.shardOf(sc.hash[i])].t
			if sc.next[i].Fresh(now) {
				t.remove(sc.entry[i])
			} else if packable(sc.next[i]) {
				t.set(sc.entry[i], sc.next[i])
			}
		}
		for i := range reqs {
			if sc.entry[i] != 0 || sc.next[i].Fresh(now) || !packable(sc.next[i]) || m.repeatedLater(reqs, sc.hash, i) {
				continue
			}
			t := &m.shards[m.shardOf(sc.hash[i])].t
			if e := t.add(sc.hash[i], reqs[i].Key, sc.next[i], now); e > 0 {
				m.evictions.Add(uint64(e))
			}
		}
	}
	for _, s := range sc.locked {
		m.shards[s].t.dropFresh(now)
	}
	return Admitted(reqs, out), nil
}

// countExpired counts the slots of reqs' keys, as stored before a charged batch, that expired
// by now (and so the batch's state no longer holds), each key once.
func (m *Memory) countExpired(reqs []Request, states []State, now int64) {
	for i := range reqs {
		if reqs[i].Limit.Algorithm != limit.Concurrency || slices.ContainsFunc(reqs[:i], func(r Request) bool { return r.Key == reqs[i].Key }) {
			continue
		}
		if n := len(states[i].Slots) - len(liveSlots(states[i], now)); n > 0 {
			m.expired.Add(uint64(n))
		}
	}
}

var _ SlotStats = (*Memory)(nil)

// SlotsExpired implements SlotStats.
func (m *Memory) SlotsExpired() uint64 { return m.expired.Load() }

// Reset implements Resetter: it forgets keys.
func (m *Memory) Reset(_ context.Context, keys []string) error {
	for _, k := range keys {
		h := maphash.String(m.seed, k)
		s := &m.shards[m.shardOf(h)]
		s.mu.Lock()
		if e := s.t.lookup(h, k); e != 0 {
			s.t.remove(e)
		}
		s.mu.Unlock()
	}
	return nil
}

func (m *Memory) shardOf(hash uint64) int { return int(hash % uint64(len(m.shards))) }

// repeatedLater reports whether reqs[i].Key occurs again after i.
func (m *Memory) repeatedLater(reqs []Request, hash []uint64, i int) bool {
	for j := i + 1; j < len(reqs); j++ {
		if hash[j] == hash[i] && reqs[j].Key == reqs[i].Key {
			return true
		}
	}
	return false
}
