package backend

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// MemoryOptions configures a Memory backend. The zero value is usable.
type MemoryOptions struct {
	// MaxKeys bounds the number of keys kept (default 1,000,000). Past it the least recently
	// used key is forgotten; see Memory for what that does to accuracy.
	MaxKeys int
	// Shards is the number of independently locked partitions (default 64).
	Shards int
	// Now is the clock (default time.Now). Tests pass a fake.
	Now func() time.Time
}

// Memory is a Backend that keeps GCRA state in this process: exact for one replica, shared by
// nothing. It is safe for concurrent use. State is sharded by key hash, each shard an LRU bounded
// by MaxKeys/Shards, and a key is dropped once it is back to a full burst (its state is then the
// same as no state at all), lazily: the oldest entries of a shard are checked on each decision.
//
// Eviction and accuracy: a key evicted while it still holds usage is forgotten, and its next
// request sees a full burst. Each such eviction can over-admit up to Burst requests for that key.
// Evictions happen only when more than MaxKeys keys hold usage at once; size MaxKeys above the
// number of keys active within the longest limit period to keep decisions exact.
type Memory struct {
	seed   maphash.Seed
	shards []memShard
	now    func() time.Time
	pool   sync.Pool // *scratch
}

type memShard struct {
	mu  sync.Mutex
	lru *simplelru.LRU[string, State]
	_   [40]byte // keep shards' locks on separate cache lines
}

// scratch holds a decision's working state so that steady-state decisions allocate nothing.
type scratch struct {
	shard  []int
	locked []int
	base   []State
	next   []State
}

var _ Backend = (*Memory)(nil)

// NewMemory returns a Memory backend.
func NewMemory(opts MemoryOptions) (*Memory, error) {
	if opts.MaxKeys == 0 {
		opts.MaxKeys = 1_000_000
	}
	if opts.Shards == 0 {
		opts.Shards = 64
	}
	if opts.MaxKeys < 0 || opts.Shards < 0 {
		return nil, fmt.Errorf("memory backend: max keys %d and shards %d must be > 0", opts.MaxKeys, opts.Shards)
	}
	if opts.Shards > opts.MaxKeys {
		opts.Shards = opts.MaxKeys
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	per := (opts.MaxKeys + opts.Shards - 1) / opts.Shards
	m := &Memory{seed: maphash.MakeSeed(), shards: make([]memShard, opts.Shards), now: opts.Now}
	for i := range m.shards {
		l, err := simplelru.NewLRU[string, State](per, nil)
		if err != nil {
			return nil, fmt.Errorf("memory backend: %w", err)
		}
		m.shards[i].lru = l
	}
	m.pool.New = func() any { return new(scratch) }
	return m, nil
}

// Len returns the number of keys held.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// Purge forgets every key.
func (m *Memory) Purge() {
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		s.lru.Purge()
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
	now := m.now().UnixMicro()
	sc := m.pool.Get().(*scratch)
	defer m.pool.Put(sc)
	n := len(reqs)
	sc.shard = slices.Grow(sc.shard[:0], n)[:n]
	sc.base = slices.Grow(sc.base[:0], n)[:n]
	sc.next = slices.Grow(sc.next[:0], n)[:n]
	sc.locked = sc.locked[:0]
	for i := range reqs {
		sc.shard[i] = int(maphash.String(m.seed, reqs[i].Key) % uint64(len(m.shards)))
		if !slices.Contains(sc.locked, sc.shard[i]) {
			sc.locked = append(sc.locked, sc.shard[i])
		}
	}
	// Lock in ascending order so that concurrent batches cannot deadlock.
	slices.Sort(sc.locked)
	for _, i := range sc.locked {
		m.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range sc.locked {
			m.shards[i].mu.Unlock()
		}
	}()

	for i := range reqs {
		r := &reqs[i]
		sc.base[i], _ = m.shards[sc.shard[i]].lru.Get(r.Key)
		cur := sc.base[i]
		// A key repeated within the batch sees the earlier charges of the batch.
		for j := i - 1; j >= 0; j-- {
			if reqs[j].Key == r.Key {
				cur = sc.next[j]
				break
			}
		}
		if r.Refund {
			sc.next[i], out[i] = Refund(cur, r.Limit, now, r.Cost)
		} else {
			sc.next[i], out[i] = Decide(cur, r.Limit, now, r.Cost)
		}
	}
	admitted := Admitted(reqs, out)
	if admitted {
		for i := range reqs {
			// A later request on the same key carries this one's charge (a denial returns the
			// state it was given): write the last only.
			if repeatedLater(reqs, i) {
				continue
			}
			lru := m.shards[sc.shard[i]].lru
			if sc.next[i].Fresh(now) {
				lru.Remove(reqs[i].Key)
			} else {
				lru.Add(reqs[i].Key, sc.next[i])
			}
		}
	} else {
		for i := range reqs {
			if out[i].Allowed {
				_, out[i] = Decide(sc.base[i], reqs[i].Limit, now, 0)
			}
		}
	}
	for _, i := range sc.locked {
		dropFresh(m.shards[i].lru, now)
	}
	return admitted, nil
}

func repeatedLater(reqs []Request, i int) bool {
	for j := i + 1; j < len(reqs); j++ {
		if reqs[j].Key == reqs[i].Key {
			return true
		}
	}
	return false
}

// dropFresh forgets up to two of the least recently used keys that no longer hold usage, so
// idle keys leave without a sweeper goroutine.
func dropFresh(lru *simplelru.LRU[string, State], now int64) {
	for range 2 {
		k, s, ok := lru.GetOldest()
		if !ok || !s.Fresh(now) {
			return
		}
		lru.Remove(k)
	}
}
