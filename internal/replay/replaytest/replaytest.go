// Package replaytest holds what replay's tests compare replay with: a store that is
// backend.DecideBatch alone, and the check that an engine's decision is a service's answer.
package replaytest

import (
	"context"
	"math"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/replay"
)

// Pure is a backend.Backend that is backend.DecideBatch and nothing else: every key's state in
// a map, decided at Now (µs since the epoch), stored as DecideBatch says (a state back to a full
// burst forgotten).
type Pure struct {
	Now    int64
	States map[string]backend.State
}

// NewPure returns a Pure with no state.
func NewPure() *Pure { return &Pure{States: map[string]backend.State{}} }

// Decide implements backend.Backend.
func (p *Pure) Decide(_ context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	cur, next := make([]backend.State, len(reqs)), make([]backend.State, len(reqs))
	for i := range reqs {
		cur[i] = p.States[reqs[i].Key]
	}
	if backend.DecideBatch(cur, reqs, p.Now, out, next) {
	next:
		for i := range reqs {
			for j := i + 1; j < len(reqs); j++ {
				if reqs[j].Key == reqs[i].Key {
					continue next
				}
			}
			if next[i].Fresh(p.Now) {
				delete(p.States, reqs[i].Key)
			} else {
				p.States[reqs[i].Key] = next[i]
			}
		}
	}
	return backend.Admitted(reqs, out), nil
}

// Close implements backend.Backend.
func (p *Pure) Close() error { return nil }

// ToProto is req as a RateLimitRequest, each descriptor's cost its own hits_addend.
func ToProto(req *replay.Request) *rlsv3.RateLimitRequest {
	p := &rlsv3.RateLimitRequest{Domain: req.Domain}
	for _, d := range req.Descs {
		pd := &ratelimitv3.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(uint64(d.Hits)), IsNegativeHits: d.Refund}
		for _, e := range d.Entries {
			pd.Entries = append(pd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		p.Descriptors = append(p.Descriptors, pd)
	}
	return p
}

// SameAnswer fails unless an engine's decision of a request (admitted, items) is the service's
// answer to it: the overall code, and each descriptor's code, limit name, remaining and wait.
func SameAnswer(t testing.TB, what string, admitted bool, items []replay.Item, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	if want := resp.OverallCode == rlsv3.RateLimitResponse_OK; admitted != want {
		t.Fatalf("%s: replay admitted %v, the service answered %v", what, admitted, resp.OverallCode)
	}
	for i, st := range resp.Statuses {
		best := replay.Limiting(items, i)
		if best < 0 {
			if st.CurrentLimit != nil {
				t.Fatalf("%s, descriptor %d: replay has no limit, the service answered %v", what, i, st)
			}
			continue
		}
		it := items[best]
		code := rlsv3.RateLimitResponse_OK
		wait := it.Decision.ResetAfter
		if !it.Decision.Allowed {
			wait = it.Decision.RetryAfter
			if it.Req.Mode != backend.Shadow {
				code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		rem := uint32(min(max(it.Decision.Remaining, 0), math.MaxUint32))
		never := !it.Decision.Allowed && it.Req.Unadmittable() // the service says no wait
		if st.Code != code || st.GetCurrentLimit().GetName() != it.Limit.Name || st.LimitRemaining != rem ||
			(never && st.DurationUntilReset != nil) || (!never && wait > 0 && st.GetDurationUntilReset().AsDuration() != wait) {
			t.Fatalf("%s, descriptor %d: replay %v %q remaining %d wait %v; the service %v", what, i, code, it.Limit.Name, rem, wait, st)
		}
	}
}
