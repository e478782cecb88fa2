package backend

import (
	"context"
	"errors"
	"fmt"

	"github.com/rls-project/rls/internal/limit"
)

// Mode says how a request's denial affects the rest of its batch.
type Mode uint8

const (
	// Enforce: a denial denies the whole batch.
	Enforce Mode = iota
	// Shadow: a denial is reported but never denies the batch.
	Shadow
	// Quota: a denial denies the batch only when every Quota request of the batch is denied.
	Quota
)

// Request asks to charge Cost requests to the key Key under Limit.
type Request struct {
	Key    string
	Limit  limit.Limit
	Cost   int64 // hits; 0 only checks
	Refund bool  // give Cost back instead of charging it (is_negative_hits)
	Mode   Mode
	// Slot names the slot a request under a limit.Concurrency limit acquires (Cost > 0) or
	// releases (Refund); see DecideSlot. Unused under the rate algorithms.
	Slot string
}

// OverdraftCharge reports whether r is charged even when denied: a cost above 0, not a refund,
// under an overdraft limit. Such a request never refuses its batch (see Charged).
func (r *Request) OverdraftCharge() bool {
	return r.Limit.Overdraft && r.Cost > 0 && !r.Refund && r.Limit.Rate > 0
}

// Unadmittable reports whether no wait would ever admit r: a cost above its limit's burst (a
// rate of 0 included), outside overdraft. Its denial has no time to tell.
func (r *Request) Unadmittable() bool { return r.Cost > r.Limit.Burst && !r.Limit.Overdraft }

// Backend decides batches of requests against stored state, under each request's algorithm.
type Backend interface {
	// Decide decides reqs as one unit, all or nothing: it writes one Decision per request into
	// out (len(out) ≥ len(reqs)), applies the charges only when Charged(reqs, out) holds, and
	// returns Admitted(reqs, out), the answer to give. When the batch is not charged, every
	// decision describes the unchanged state: allowed decisions then report what remains
	// without this batch's charge. A denied key is never charged, but for an overdraft charge
	// (Request.OverdraftCharge) in a charged batch. Without overdraft charges a batch is
	// charged exactly when it is admitted.
	Decide(ctx context.Context, reqs []Request, out []Decision) (admitted bool, err error)
	// Close releases the backend's resources.
	Close() error
}

// ErrUnavailable wraps a backend failure that the failure policy should handle (store down,
// timed out, circuit open). Any other error from Decide is a bug or a misconfiguration: the
// service answers it INTERNAL and logs it.
var ErrUnavailable = errors.New("backend unavailable")

// ErrOverloaded wraps ErrUnavailable for a decision shed because this process could not finish
// it within its budget while the store was healthy (local CPU saturated, not the store failing).
// The failure policy answers it like any unavailability; metrics count it apart.
var ErrOverloaded = fmt.Errorf("%w: overloaded", ErrUnavailable)

// Health is implemented by a Backend whose store can become unreachable.
type Health interface {
	// Healthy reports whether the store answers now.
	Healthy() bool
	// SubscribeHealth calls f with every change of Healthy, in order and never concurrently,
	// until cancel is called.
	SubscribeHealth(f func(healthy bool)) (cancel func())
}

// Degradation is implemented by a backend part of which can be unavailable while the rest
// answers: a Redis Cluster with a master down.
type Degradation interface {
	// Degraded says, in words, what part of the store is unavailable while the rest answers;
	// "" when all of it answers, and when none of it does (Healthy is false then).
	Degraded() string
}

// CachePurger is implemented by a Backend that keeps decisions in this process (a local
// over-limit cache) that must be forgotten when the store's state is reset.
type CachePurger interface {
	PurgeCache()
}

// Resetter is implemented by a Backend that can forget keys: each given key is back to a full
// burst (no usage, no debt) as if never seen. Keys are named as in Request.Key.
type Resetter interface {
	Reset(ctx context.Context, keys []string) error
}

// CacheStats is implemented by a Backend with a local cache: how many decisions it answered
// without asking the store.
type CacheStats interface {
	CacheHits() uint64
}

// SlotStats is implemented by a Backend that holds slots of Concurrency limits (DecideSlot):
// how many slots it found expired and dropped, each a release lost (or a request that ran past
// its slot's lifetime). A lower bound: a key whose slots all expire with no request after them
// leaves uncounted.
type SlotStats interface {
	SlotsExpired() uint64
}

// MemoryStats is implemented by a Backend that keeps its keys in this process within a bound:
// how many keys and bytes it holds, and how many keys it has forgotten while they still held
// usage to stay within the bound (each may over-admit up to its burst).
type MemoryStats interface {
	Len() int
	Bytes() int64
	Evictions() uint64
}

// Admitted reports whether a batch with these decisions is admitted: no Enforce request denied,
// and not every Quota request denied. Refunds are always allowed.
func Admitted(reqs []Request, out []Decision) bool { return verdict(reqs, out, false, allParts) }

// Charged reports whether the charges of a batch with these decisions apply: as Admitted, but
// the denial of an overdraft charge counts as allowed. So a batch whose only denials are
// overdraft charges is charged (into debt) and answered not admitted; one that an ordinary
// limit refuses charges nothing, overdraft charges included.
func Charged(reqs []Request, out []Decision) bool { return verdict(reqs, out, true, allParts) }

// The parts of a batch a verdict is over: all its requests, or only those under a rate
// algorithm, or only those under a Concurrency limit (whose Quota mode counts as Enforce).
const (
	allParts = iota
	rateParts
	slotParts
)

func verdict(reqs []Request, out []Decision, overdraft bool, part int) bool {
	quota, quotaDenied := 0, 0
	for i := range reqs {
		if part != allParts && (part == slotParts) != (reqs[i].Limit.Algorithm == limit.Concurrency) {
			continue
		}
		if part == slotParts && !out[i].Allowed && reqs[i].Mode != Shadow {
			return false
		}
		if out[i].Allowed || (overdraft && reqs[i].OverdraftCharge()) {
			if reqs[i].Mode == Quota {
				quota++
			}
			continue
		}
		switch reqs[i].Mode {
		case Enforce:
			return false
		case Quota:
			quota++
			quotaDenied++
		}
	}
	return quota == 0 || quotaDenied < quota
}
