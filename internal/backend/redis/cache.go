package redis

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// denial is what the local cache keeps of a request Redis denied: under every algorithm only
// time admits that key again for that cost or more (GCRA's TAT, a fixed window's end, a sliding
// window's decaying estimate, a sliding log's oldest hits leaving), and other requests can only
// push that instant later, so until RetryAfter the answer is known without asking. A refund
// elsewhere can bring it sooner, as under GCRA alone before.
type denial struct {
	limit     limit.Limit
	cost      int64
	until     time.Time // process clock: when the request was sent plus its RetryAfter
	reset     time.Time
	remaining int64
}

// maxCachedKeyBytes is the longest key the local cache keeps, so that it holds at most its size
// times about 0.8 KB: Envoy's keys take tens of bytes, a client's can take --max-request-bytes.
// A longer key is decided by Redis every time, as with no cache.
const maxCachedKeyBytes = 512

// denials is the local over-limit cache, keyed by the key as the service names it. It is safe
// for concurrent use.
type denials struct{ c *lru.Cache[string, denial] }

func newDenials(size int) (*denials, error) {
	c, err := lru.New[string, denial](size)
	if err != nil {
		return nil, err
	}
	return &denials{c}, nil
}

// lookup returns the decision for r at now when the cache knows it is denied. A refund, another
// limit (rules changed) or a smaller cost (which may be admitted sooner) is not known, nor is an
// overdraft charge: it must reach Redis to be charged. A check of a key in debt is denied until
// the debt is repaid, so it is known. present says whether the cache holds an entry for the key
// at all.
func (d *denials) lookup(r *backend.Request, now time.Time) (dec backend.Decision, ok, present bool) {
	if r.Refund || r.OverdraftCharge() {
		return backend.Decision{}, false, true // not looked up: may be held
	}
	e, present := d.c.Get(r.Key)
	if !present || e.limit != r.Limit || r.Cost < e.cost || !now.Before(e.until) {
		return backend.Decision{}, false, present
	}
	return backend.Decision{
		Remaining:  e.remaining,
		RetryAfter: ceilMicro(e.until.Sub(now)),
		ResetAfter: ceilMicro(max(e.reset.Sub(now), 0)),
	}, true, true
}

// learn records what Redis answered for r, asked at sent.
func (d *denials) learn(r *backend.Request, dec backend.Decision, sent time.Time) {
	switch {
	case r.Refund:
		// A refund can admit the key sooner than the cached instant.
		d.c.Remove(r.Key)
	case dec.Allowed, r.OverdraftCharge():
		// The key's state changed: what a cached denial says of it is stale.
		d.c.Remove(r.Key)
	case r.Cost > r.Limit.Burst:
		// Never admitted, but its RetryAfter is no instant of admission to cache until.
	case len(r.Key) > maxCachedKeyBytes:
		// Not kept: the cache's bound is a count of keys, so its memory is bounded only if
		// each key is.
	case dec.RetryAfter > 0:
		d.c.Add(r.Key, denial{limit: r.Limit, cost: r.Cost, until: sent.Add(dec.RetryAfter),
			reset: sent.Add(dec.ResetAfter), remaining: dec.Remaining})
	}
}

func ceilMicro(d time.Duration) time.Duration {
	return (d + time.Microsecond - 1).Truncate(time.Microsecond)
}
