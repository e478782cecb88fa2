package client

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/statekey"
)

// LocalTier is an optional first tier in this process: a GCRA bucket per descriptor, decided by
// rls's own exact GCRA (the memory backend rls itself runs), that admits a request without
// asking rls while every descriptor of the request has room in its local bucket. A request the
// local tier cannot admit goes to rls, which decides it as always. So the local tier takes
// bursts off rls and off the request's latency, and a process admits at most what its local
// buckets hold plus what rls admits: see docs/go-client.md on sizing it from the global limit and the
// replica count.
type LocalTier struct {
	// Limit returns the local limit of a descriptor; ok false sends every request with that
	// descriptor to rls. EachDescriptor gives every descriptor the same limit.
	Limit func(Descriptor) (l LocalLimit, ok bool)
	// MaxBytes bounds the memory the local buckets take (default 16 MiB); past it the least
	// recently used buckets are forgotten, which can admit up to a burst more for each.
	MaxBytes int64
	// Now is the clock (default time.Now). Tests pass a fake.
	Now func() time.Time
}

// LocalLimit is a local bucket: Requests per Per, and up to Burst at once after a quiet period.
type LocalLimit struct {
	Name     string // reported as the limit's name in headers
	Requests int64
	Per      time.Duration // whole microseconds
	Burst    int64         // default Requests
}

// EachDescriptor returns a LocalTier.Limit giving every descriptor the limit l.
func EachDescriptor(l LocalLimit) func(Descriptor) (LocalLimit, bool) {
	return func(Descriptor) (LocalLimit, bool) { return l, true }
}

func (l LocalLimit) gcra() (limit.Limit, error) {
	g := limit.Limit{Rate: l.Requests, Period: l.Per, Burst: l.Burst}
	if g.Burst == 0 {
		g.Burst = g.Rate
	}
	if l.Requests <= 0 || l.Requests > math.MaxUint32 {
		return g, fmt.Errorf("%w: local limit %q: requests %d must be in [1, %d]", ErrInvalid, l.Name, l.Requests, uint32(math.MaxUint32))
	}
	if err := g.Validate(); err != nil {
		return g, fmt.Errorf("%w: local limit %q: %v", ErrInvalid, l.Name, err)
	}
	return g, nil
}

type local struct {
	domain string
	limit  func(Descriptor) (LocalLimit, bool)
	mem    *backend.Memory
	pool   sync.Pool // *localWork
}

type localWork struct {
	limits []LocalLimit
	reqs   []backend.Request
	out    []backend.Decision
	ends   []int
	key    []byte
}

func newLocal(domain string, t LocalTier) (*local, error) {
	if t.Limit == nil {
		return nil, fmt.Errorf("client: LocalTier.Limit is nil")
	}
	if t.MaxBytes == 0 {
		t.MaxBytes = 16 << 20
	}
	mem, err := backend.NewMemory(backend.MemoryOptions{MaxBytes: t.MaxBytes, Now: t.Now})
	if err != nil {
		return nil, fmt.Errorf("client: local tier: %w", err)
	}
	l := &local{domain: domain, limit: t.Limit, mem: mem}
	l.pool.New = func() any { return new(localWork) }
	return l, nil
}

// decide admits the request locally when every descriptor has a local limit with room for n
// hits (ok true), all or nothing. Otherwise it charges nothing and returns ok false.
func (l *local) decide(descs []Descriptor, n uint32) (Decision, bool, error) {
	w := l.pool.Get().(*localWork)
	defer l.pool.Put(w)
	w.limits, w.reqs, w.ends, w.key = w.limits[:0], w.reqs[:0], w.ends[:0], w.key[:0]
	cost := int64(max(n, 1))
	for _, d := range descs {
		ll, ok := l.limit(d)
		if !ok {
			return Decision{}, false, nil
		}
		g, err := ll.gcra()
		if err != nil {
			return Decision{}, false, err
		}
		w.limits = append(w.limits, ll)
		w.reqs = append(w.reqs, backend.Request{Limit: g, Cost: cost})
		w.key = statekey.AppendField(w.key, l.domain)
		for _, e := range d {
			w.key = statekey.AppendField(w.key, e.Key)
			w.key = statekey.AppendField(w.key, e.Value)
		}
		w.ends = append(w.ends, len(w.key))
	}
	keys := string(w.key) // one allocation for every key of the request
	start := 0
	for i := range w.reqs {
		w.reqs[i].Key = keys[start:w.ends[i]]
		start = w.ends[i]
	}
	if cap(w.out) < len(w.reqs) {
		w.out = make([]backend.Decision, len(w.reqs))
	}
	w.out = w.out[:len(w.reqs)]
	admitted, err := l.mem.Decide(context.Background(), w.reqs, w.out)
	if err != nil || !admitted {
		return Decision{}, false, nil
	}
	d := Decision{Source: SourceLocal, Statuses: make([]Status, len(descs))}
	for i := range descs {
		d.Statuses[i] = Status{
			Descriptor: descs[i],
			Limit:      Limit{Name: w.limits[i].Name, Requests: uint32(w.limits[i].Requests), Window: w.limits[i].Per},
			Remaining:  uint32(max(w.out[i].Remaining, 0)),
			Wait:       w.out[i].ResetAfter,
		}
	}
	d.decide(false)
	return d, true, nil
}
