package client

import (
	"net/http"
	"time"

	"github.com/rls-project/rls/internal/ratelimitheader"
)

// Limit is a rate limit as rls reports it: Requests per Window, under a rule's Name. The zero
// value means no limit applied (no rule matched, or an unlimited rule).
type Limit struct {
	Name     string
	Requests uint32
	Window   time.Duration // the unit times its multiplier; a month is 30 days, a year 365
}

// Status is rls's answer for one descriptor of a request.
type Status struct {
	Descriptor Descriptor
	OverLimit  bool
	Limit      Limit  // zero when no limit applied
	Remaining  uint32 // requests still admitted after this one
	// Wait is duration_until_reset: for an over-limit descriptor the time until the request
	// would be admitted, otherwise the time until its limit is fully restored.
	Wait time.Duration
}

// Source says who decided.
type Source uint8

const (
	// SourceRLS: rls answered.
	SourceRLS Source = iota
	// SourceLocal: the local tier admitted the request without asking rls.
	SourceLocal
	// SourceFailure: rls did not answer in time and the failure policy decided.
	SourceFailure
)

func (s Source) String() string {
	switch s {
	case SourceLocal:
		return "local"
	case SourceFailure:
		return "failure_policy"
	}
	return "rls"
}

// Decision is the outcome of one check. The zero value denies.
type Decision struct {
	Allowed bool
	// Descriptor is the limiting descriptor: when denied, the over-limit descriptor with the
	// longest wait (the first of equals); when allowed, the limited descriptor with the fewest
	// requests remaining. Nil when no descriptor had a limit.
	Descriptor Descriptor
	Limit      Limit  // the limiting descriptor's limit
	Remaining  uint32 // the limiting descriptor's remaining requests
	// RetryAfter is how long to wait before the request would be admitted; zero when allowed.
	RetryAfter time.Duration
	// Reset is the limiting descriptor's duration_until_reset: when allowed, the time until it
	// is back to a full burst.
	Reset  time.Duration
	Source Source
	// Err is why rls did not answer, when Source is SourceFailure.
	Err error
	// Statuses holds one status per descriptor of the request, in order (none when the
	// failure policy decided).
	Statuses []Status
	// RLSHeaders are the response_headers_to_add rls sent (rls --response-headers), and Body its
	// raw_body; WriteHeaders writes those not already written.
	RLSHeaders http.Header
	Body       []byte
}

// decide fills the summary fields of d from d.Statuses; overLimit is the overall code.
func (d *Decision) decide(overLimit bool) {
	d.Allowed = !overLimit
	best := -1
	if overLimit {
		for i := range d.Statuses {
			if st := &d.Statuses[i]; st.OverLimit && (best < 0 || st.Wait > d.Statuses[best].Wait) {
				best = i
			}
		}
	}
	if best < 0 {
		for i := range d.Statuses {
			if st := &d.Statuses[i]; limited(st) && (best < 0 || st.Remaining < d.Statuses[best].Remaining) {
				best = i
			}
		}
	}
	if best < 0 {
		if overLimit {
			d.RetryAfter = time.Second
		}
		return
	}
	st := &d.Statuses[best]
	d.Descriptor, d.Limit, d.Remaining, d.Reset = st.Descriptor, st.Limit, st.Remaining, st.Wait
	if overLimit {
		d.RetryAfter = max(st.Wait, time.Second)
	}
}

// HeaderStyle selects the rate-limit response headers WriteHeaders writes.
type HeaderStyle uint8

const (
	// HeadersDraft writes the IETF draft's RateLimit-Policy and RateLimit structured fields
	// (draft-ietf-httpapi-ratelimit-headers-10), exactly as rls --response-headers draft emits
	// them: one list item per limited descriptor, named by its rule's name or descriptor-<i>.
	HeadersDraft HeaderStyle = iota
	// HeadersLegacy writes X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (delta
	// seconds) as Envoy's enable_x_ratelimit_headers DRAFT_VERSION_03 does, and as rls
	// --response-headers legacy does under those names.
	HeadersLegacy
	// HeadersNone writes no rate-limit headers (Retry-After still goes on a denial).
	HeadersNone
)

// WriteHeaders sets on h the headers a response carries for d: the rate-limit headers in style,
// Retry-After (whole seconds, at least 1) when denied, then each header rls sent that h does not
// already hold.
func (d *Decision) WriteHeaders(h http.Header, style HeaderStyle) {
	switch style {
	case HeadersDraft:
		d.draft(h)
	case HeadersLegacy:
		d.legacy(h)
	}
	if !d.Allowed {
		h.Set("Retry-After", ratelimitheader.RetryAfter(d.RetryAfter))
	}
	for k, vs := range d.RLSHeaders {
		if _, ok := h[k]; !ok {
			h[k] = vs
		}
	}
}

// Header returns the headers WriteHeaders writes.
func (d *Decision) Header(style HeaderStyle) http.Header {
	h := http.Header{}
	d.WriteHeaders(h, style)
	return h
}

func limited(st *Status) bool { return st.Limit.Requests != 0 || st.Limit.Window != 0 }

// status is st as the headers show it.
func (d *Decision) status(i int) ratelimitheader.Status {
	st := &d.Statuses[i]
	return ratelimitheader.Status{Limited: limited(st), Name: st.Limit.Name, Requests: st.Limit.Requests,
		Window: int64(st.Limit.Window / time.Second), Remaining: st.Remaining, Reset: st.Wait}
}

func (d *Decision) draft(h http.Header) {
	if policy, state, ok := ratelimitheader.Draft(len(d.Statuses), d.status); ok {
		h["Ratelimit-Policy"] = []string{policy}
		h["Ratelimit"] = []string{state}
	}
}

func (d *Decision) legacy(h http.Header) {
	if limit, remaining, reset, ok := ratelimitheader.Legacy(len(d.Statuses), d.status); ok {
		h["X-Ratelimit-Limit"] = []string{limit}
		h["X-Ratelimit-Remaining"] = []string{remaining}
		h["X-Ratelimit-Reset"] = []string{reset}
	}
}
