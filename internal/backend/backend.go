package backend

import (
	"context"
	"errors"
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
	Limit  Limit
	Cost   int64 // hits; 0 only checks
	Refund bool  // give Cost back instead of charging it (is_negative_hits)
	Mode   Mode
}

// Backend decides batches of requests against stored GCRA state.
type Backend interface {
	// Decide decides reqs as one unit, all or nothing: it writes one Decision per request into
	// out (len(out) ≥ len(reqs)) and applies the charges only when Admitted(reqs, out) holds. When
	// the batch is not admitted, every decision describes the unchanged state: allowed decisions
	// then report what remains without this batch's charge. A denied key is never charged.
	Decide(ctx context.Context, reqs []Request, out []Decision) (admitted bool, err error)
	// Close releases the backend's resources.
	Close() error
}

// ErrUnavailable wraps a backend failure that the failure policy should handle (store down,
// timed out, circuit open).
var ErrUnavailable = errors.New("backend unavailable")

// Admitted reports whether a batch with these decisions is admitted: no Enforce request denied,
// and not every Quota request denied. Refunds are always allowed.
func Admitted(reqs []Request, out []Decision) bool {
	quota, quotaDenied := 0, 0
	for i := range reqs {
		if out[i].Allowed {
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
