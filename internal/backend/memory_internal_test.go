package backend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// TestMemoryEqualsDecideBatch: the memory backend stores what DecideBatch says, on random
// batches at fixed instants, as the simplest store of its outcomes does.
func TestMemoryEqualsDecideBatch(t *testing.T) {
	limits := []limit.Limit{
		{Rate: 2, Period: time.Second, Burst: 3},
		{Rate: 7, Period: time.Second, Burst: 2},
		{Rate: 0, Period: time.Second},
	}
	keys := []string{"a", "b", "c", "d"}
	now := int64(1_700_000_000) * sec
	m, err := NewMemory(MemoryOptions{Now: func() time.Time { return time.UnixMicro(now) }})
	if err != nil {
		t.Fatal(err)
	}
	ref := store{}
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 5_000 {
		now += rng.Int64N(300_000)
		reqs := make([]Request, 1+rng.IntN(6))
		for i := range reqs {
			reqs[i] = Request{
				Key: keys[rng.IntN(len(keys))], Limit: limits[rng.IntN(len(limits))],
				Cost: rng.Int64N(5), Refund: rng.IntN(6) == 0, Mode: Mode(rng.IntN(3)),
			}
		}
		want, _, _, wantAdmitted := ref.decide(reqs, now)
		out := make([]Decision, len(reqs))
		admitted, err := m.Decide(context.Background(), reqs, out)
		if err != nil {
			t.Fatal(err)
		}
		if admitted != wantAdmitted || !slices.Equal(out, want) {
			t.Fatalf("batch %d %+v: got admitted=%v %+v, want admitted=%v %+v", n, reqs, admitted, out, wantAdmitted, want)
		}
	}
}

// checkTable verifies the table's invariants: the ring holds every entry once, the index
// points at each, and n and bytes add up.
func checkTable(t *testing.T, tb *lruTable) []string {
	t.Helper()
	var keys []string
	bytes := int64(0)
	for i, prev := tb.entries[0].next, int32(0); i != 0; prev, i = i, tb.entries[i].next {
		e := &tb.entries[i]
		if e.prev != prev {
			t.Fatalf("entry %d (%q): prev %d, want %d", i, e.key, e.prev, prev)
		}
		if j := tb.index[tb.hash(e.key)]; j != i {
			t.Fatalf("entry %d (%q): index says %d", i, e.key, j)
		}
		keys = append(keys, e.key)
		bytes += int64(len(e.key)) + entryOverhead
		if len(keys) > len(tb.entries) {
			t.Fatal("the ring loops")
		}
	}
	if len(keys) != tb.n || len(tb.index) != tb.n || bytes != tb.bytes {
		t.Fatalf("ring has %d keys of %d bytes; n %d, index %d, bytes %d", len(keys), bytes, tb.n, len(tb.index), tb.bytes)
	}
	return keys // most recent first
}

// TestLRUTable drives a table with random lookups, adds and removals and compares it with a
// list in recency order.
func TestLRUTable(t *testing.T) {
	const maxBytes = 20 * (entryOverhead + 3)
	m, _ := NewMemory(MemoryOptions{})
	tb := newLRUTable(m.seed, maxBytes, 0)
	var model []string // most recent first
	rng := rand.New(rand.NewPCG(5, 6))
	used := State{TAT: 2e12, Rate: 1, Period: 1}
	now := int64(1e12)
	evictions := 0
	for step := range 20_000 {
		k := fmt.Sprint(rng.IntN(60))
		if len(k) == 1 {
			k += "xx" // keys of 3 or 4 bytes: 20 to 21 fit the bound
		}
		h := tb.hash(k)
		i := tb.lookup(h, k)
		at := slices.Index(model, k)
		if (i != 0) != (at >= 0) {
			t.Fatalf("step %d: lookup %q found entry %d, model has it at %d", step, k, i, at)
		}
		if at >= 0 {
			model = slices.Insert(slices.Delete(model, at, at+1), 0, k)
		}
		switch {
		case i != 0 && rng.IntN(3) == 0:
			tb.remove(i)
			model = model[1:]
		case i == 0:
			evictions += tb.add(h, k, used, now)
			model = slices.Insert(model, 0, k)
			size := int64(0)
			for j, mk := range model {
				if size += int64(len(mk)) + entryOverhead; size > maxBytes {
					model = model[:j]
					break
				}
			}
		}
		if got := checkTable(t, &tb); !slices.Equal(got, model) {
			t.Fatalf("step %d: table %v, model %v", step, got, model)
		}
	}
	if evictions == 0 {
		t.Fatal("no eviction: the test no longer reaches the bound")
	}
}

func TestEntryPacksState(t *testing.T) {
	for _, s := range []State{
		{TAT: 1, Frac: 0, Rate: 1, Period: 1},
		{TAT: -5, Frac: 1<<32 - 1, Rate: 1 << 32, Period: int64(limit.MaxTolerance / time.Microsecond)},
		{TAT: 1 << 62, Frac: 6, Rate: 7, Period: 1_000_000},
	} {
		var e lruEntry
		e.set(s)
		if !packable(s) || !e.state().Equal(s) {
			t.Errorf("%+v: packable %v, unpacked %+v", s, packable(s), e.state())
		}
	}
	for _, s := range []State{{Rate: 0}, {Rate: 1<<32 + 1}, {Rate: 3, Frac: 3}, {Rate: 3, Frac: -1}} {
		if packable(s) {
			t.Errorf("%+v: packable, want not", s)
		}
	}
}
