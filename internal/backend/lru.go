package backend

import (
	"hash/maphash"
	"strings"

	"github.com/rls-project/rls/internal/limit"
)

// entryOverhead is what one key costs in memory beyond its own bytes: its lruEntry (56 bytes),
// its slot in the index map (a uint64 key and an int32 value, 16 bytes, in groups of 8 kept at
// most 7/8 full), the growth slack of both, and the rounding of the key's copy up to its
// allocation size class. Measured with TestMemoryFootprint (live heap after a GC, less the key
// bytes, per key): 70, 83 and 91 bytes at 100k, 300k and 1M keys of 22 bytes, 76 at 100k keys
// of 4 KB (92 at 300k once the entry grew by its extState pointer). Rounded up so that the bound
// holds wherever the map and the slice are in their growth steps. A window algorithm's state
// counts its extState on top (extBytes).
const entryOverhead = 112

// lruEntry is one key and its state, packed: Rate is stored less one and, with Frac, in 32 bits,
// which holds any state of a valid limit (Rate ≤ 2^32, 0 ≤ Frac < Rate).
type lruEntry struct {
	key        string
	tat        int64
	period     int64
	frac       uint32
	rate1      uint32    // Rate - 1
	prev, next int32     // the recency ring through entries[0]; next chains the free list
	ext        *extState // the state of a window algorithm, nil under GCRA
}

// extState is what a window algorithm's state holds beyond a GCRA state's fields.
type extState struct {
	alg         limit.Algorithm
	count, prev int64
	log         []int64
	slots       []Slot
}

// extBytes is what an extState costs beyond its entry: the struct, its log and its slots.
func extBytes(x *extState) int64 {
	if x == nil {
		return 0
	}
	n := 72 + 8*int64(cap(x.log)) + slotBytes*int64(cap(x.slots))
	for _, sl := range x.slots {
		n += int64(len(sl.ID))
	}
	return n
}

func (e *lruEntry) state() State {
	if x := e.ext; x != nil {
		return State{TAT: e.tat, Frac: x.count, Prev: x.prev, Rate: int64(e.rate1) + 1, Period: e.period, Alg: x.alg, Log: x.log, Slots: x.slots}
	}
	return State{TAT: e.tat, Frac: int64(e.frac), Rate: int64(e.rate1) + 1, Period: e.period}
}

// set stores s; it returns the change in the bytes the entry's extState takes.
func (e *lruEntry) set(s State) int64 {
	e.tat, e.period, e.rate1 = s.TAT, s.Period, uint32(s.Rate-1)
	before := extBytes(e.ext)
	if s.Alg == limit.GCRA {
		e.frac, e.ext = uint32(s.Frac), nil
		return -before
	}
	if e.ext == nil {
		e.ext = new(extState)
	}
	*e.ext = extState{alg: s.Alg, count: s.Frac, prev: s.Prev, log: s.Log, slots: s.Slots}
	return extBytes(e.ext) - before
}

// packable reports whether set keeps s exactly.
func packable(s State) bool {
	if s.Alg != limit.GCRA {
		return s.Rate >= 1 && s.Rate <= 1<<32
	}
	return s.Rate >= 1 && s.Rate <= 1<<32 && s.Frac >= 0 && s.Frac < s.Rate
}

// set stores s in entry i, counting what its extState takes.
func (t *lruTable) set(i int32, s State) { t.bytes += t.entries[i].set(s) }

// lruTable is one shard's keys, least recently used first out, bounded in bytes and in count.
// It is not safe for concurrent use. Entries live in one slice linked by index (no allocation
// per entry, nothing per entry for the GC to trace but the key), and the index maps a key's
// 64-bit hash to its entry: two keys with the same hash share an entry, the later replacing the
// earlier as an eviction would (about one pair in 2^64/n² for n keys, with a random seed).
type lruTable struct {
	index    map[uint64]int32
	entries  []lruEntry // entries[0] is the ring's sentinel: its next is the most recent entry
	free     int32      // first free entry, 0 when none
	n        int        // keys held
	bytes    int64      // their cost: len(key) + entryOverhead each
	maxBytes int64
	maxKeys  int          // 0: no bound but maxBytes
	seed     maphash.Seed // of the hashes in index
}

func newLRUTable(seed maphash.Seed, maxBytes int64, maxKeys int) lruTable {
	return lruTable{index: map[uint64]int32{}, entries: make([]lruEntry, 1), maxBytes: maxBytes, maxKeys: maxKeys, seed: seed}
}

// hash returns the hash of key that index is keyed by.
func (t *lruTable) hash(key string) uint64 { return maphash.String(t.seed, key) }

// lookup returns the entry of key, 0 if none, and marks it most recently used.
func (t *lruTable) lookup(hash uint64, key string) int32 {
	i, ok := t.index[hash]
	if !ok || t.entries[i].key != key {
		return 0
	}
	t.unlink(i)
	t.pushFront(i)
	return i
}

// add stores s for key, which lookup did not find, as the most recently used entry, then
// forgets least recently used entries while over a bound, never the one just added. It returns
// how many of those still held usage at now.
func (t *lruTable) add(hash uint64, key string, s State, now int64) (evicted int) {
	key = strings.Clone(key) // the caller's key may share memory with more than itself
	i, ok := t.index[hash]
	switch {
	case ok: // another key with the same hash: replace it
		if !t.entries[i].state().Fresh(now) {
			evicted++
		}
		t.bytes += int64(len(key)-len(t.entries[i].key)) - extBytes(t.entries[i].ext)
		t.entries[i].ext = nil
		t.unlink(i)
	case t.free != 0:
		i = t.free
		t.free = t.entries[i].next
		t.n++
		t.bytes += int64(len(key)) + entryOverhead
	default:
		i = int32(len(t.entries))
		t.entries = append(t.entries, lruEntry{})
		t.n++
		t.bytes += int64(len(key)) + entryOverhead
	}
	t.index[hash] = i
	e := &t.entries[i]
	e.key = key
	t.bytes += e.set(s)
	t.pushFront(i)
	for t.bytes > t.maxBytes || (t.maxKeys > 0 && t.n > t.maxKeys) {
		oldest := t.entries[0].prev
		if oldest == i {
			break
		}
		if !t.entries[oldest].state().Fresh(now) {
			evicted++
		}
		t.remove(oldest)
	}
	return evicted
}

// remove forgets entry i.
func (t *lruTable) remove(i int32) {
	delete(t.index, t.hash(t.entries[i].key))
	t.unlink(i)
	e := &t.entries[i]
	t.n--
	t.bytes -= int64(len(e.key)) + entryOverhead + extBytes(e.ext)
	*e = lruEntry{next: t.free}
	t.free = i
}

// oldest returns the least recently used entry, 0 if none.
func (t *lruTable) oldest() int32 { return t.entries[0].prev }

func (t *lruTable) unlink(i int32) {
	e := &t.entries[i]
	t.entries[e.prev].next = e.next
	t.entries[e.next].prev = e.prev
}

func (t *lruTable) pushFront(i int32) {
	first := t.entries[0].next
	t.entries[i].prev, t.entries[i].next = 0, first
	t.entries[first].prev = i
	t.entries[0].next = i
}

// dropFresh forgets up to two of the least recently used keys that no longer hold usage, so
// idle keys leave without a sweeper goroutine.
func (t *lruTable) dropFresh(now int64) {
	for range 2 {
		i := t.oldest()
		if i == 0 || !t.entries[i].state().Fresh(now) {
			return
		}
		t.remove(i)
	}
}
