package rlqs

import (
	"context"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// reportBudget bounds the bytes of the usage reports being decoded and taken in at once, of
// all streams together. A report is read from gRPC as its raw bytes (the length its prefix
// declared, already bounded by --rlqs-max-report-bytes), and its bytes are reserved here before
// it is decoded: decoded, a report costs many times its size (a map, strings and a message per
// bucket: about 12 bytes of heap per byte on the wire for one-pair buckets), so what the
// reports of 512 streams cost at once is the budget's, not the streams'. A report that does not
// fit waits, in the order it came, up to a bounded time; the reports waiting hold at most
// another budget of raw bytes, and one that would pass it, or that waited its time out, is
// refused.
type reportBudget struct {
	max int64

	mu      sync.Mutex
	used    int64 // bytes reserved by the reports being taken in
	waiting int64 // bytes of the reports waiting
	queue   []*budgetWaiter
}

type budgetWaiter struct {
	n       int64
	granted chan struct{} // closed when n is reserved for it
}

func newReportBudget(max int64) *reportBudget { return &reportBudget{max: max} }

// acquire reserves n bytes, waiting up to wait (or until ctx ends) for them. It reports false
// when they were not reserved: the report is refused. n > max never fits.
func (b *reportBudget) acquire(ctx context.Context, n int64, wait time.Duration) bool {
	b.mu.Lock()
	if n > b.max {
		b.mu.Unlock()
		return false
	}
	if len(b.queue) == 0 && b.used+n <= b.max {
		b.used += n
		b.mu.Unlock()
		return true
	}
	if wait <= 0 || b.waiting+n > b.max {
		b.mu.Unlock()
		return false
	}
	w := &budgetWaiter{n: n, granted: make(chan struct{})}
	b.queue = append(b.queue, w)
	b.waiting += n
	b.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-w.granted:
		return true
	case <-timer.C:
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.granted: // granted as the wait ended: it is reserved
		return true
	default:
	}
	for i, q := range b.queue {
		if q == w {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			break
		}
	}
	b.waiting -= n
	b.grantLocked() // the head may have been this one, holding back those behind it
	return false
}

// release gives back n bytes reserved by acquire, and reserves them for the reports waiting
// in turn.
func (b *reportBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.grantLocked()
}

// grantLocked reserves what is free for the waiting reports, first come first served: a large
// report at the head is not passed by smaller ones behind it, so it is not starved.
func (b *reportBudget) grantLocked() {
	for len(b.queue) > 0 && b.used+b.queue[0].n <= b.max {
		w := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		b.used += w.n
		b.waiting -= w.n
		close(w.granted)
	}
}

// inUse is the bytes reserved now.
func (b *reportBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// budgeted is a report decoded within the budget, and how to give its bytes back once it is
// taken in (later calls do nothing).
type budgeted struct {
	*rlqspb.RateLimitQuotaUsageReports
	release func()
}

// recv reads the stream's next report within the budget. A report that finds no room in time
// ends the stream with RESOURCE_EXHAUSTED; one that does not decode, with INVALID_ARGUMENT.
func (s *Server) recv(ctx context.Context, ss grpc.ServerStream, st *stream) (budgeted, error) {
	r := reportReader{ctx: ctx, s: s}
	if err := ss.RecvMsg(&r); err != nil {
		return budgeted{}, err
	}
	switch {
	case r.refused:
		if err := ctx.Err(); err != nil {
			return budgeted{}, status.FromContextError(err).Err()
		}
		return budgeted{}, s.refuse(st, "report_budget", codes.ResourceExhausted,
			"a report of %d bytes found no room within %v among the reports of %d bytes in all taken in at once (--rlqs-report-budget-bytes)",
			r.n, s.reportWait, s.budget.max)
	case r.err != nil:
		return budgeted{}, s.invalid(st, "bad_report", "the report does not decode: %v", r.err)
	}
	var once sync.Once
	n := r.n
	return budgeted{r.m, func() { once.Do(func() { s.budget.release(n) }) }}, nil
}

// reportReader is what a stream's report is read into: gRPC's codec hands it the report's bytes
// (a protobuf message with a legacy Unmarshal method is given the bytes whole, undecoded), and
// it decodes them only once they are reserved in the budget, holding them meanwhile.
type reportReader struct {
	ctx context.Context
	s   *Server

	n       int64
	m       *rlqspb.RateLimitQuotaUsageReports // decoded within the budget
	refused bool                               // no room in time: n is not reserved
	err     error                              // did not decode: n is released
}

// Unmarshal reserves len(b) in the budget and decodes b. It does not keep b (gRPC reuses it).
// It returns nil whatever happens, so that gRPC does not answer INTERNAL: recv answers.
func (r *reportReader) Unmarshal(b []byte) error {
	r.n = int64(len(b))
	if !r.s.budget.acquire(r.ctx, r.n, r.s.reportWait) {
		r.refused = true
		return nil
	}
	r.m = new(rlqspb.RateLimitQuotaUsageReports)
	if err := proto.Unmarshal(b, r.m); err != nil {
		r.s.budget.release(r.n)
		r.m, r.err = nil, err
	}
	return nil
}

// Reset, String and ProtoMessage make reportReader a protobuf message to gRPC's codec.
func (r *reportReader) Reset()         {}
func (r *reportReader) String() string { return "rlqs.reportReader" }
func (r *reportReader) ProtoMessage()  {}
