package service

import (
	"cmp"
	"fmt"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/ratelimitheader"
)

// HeaderMode selects the rate-limit headers rls adds to responses (response_headers_to_add).
// Envoy computes X-RateLimit-* itself (enable_x_ratelimit_headers), so the default adds none.
type HeaderMode uint8

const (
	// HeadersNone adds no headers.
	HeadersNone HeaderMode = iota
	// HeadersDraft adds the IETF draft's RateLimit-Policy and RateLimit structured fields
	// (draft-ietf-httpapi-ratelimit-headers-10), plus Retry-After when denied.
	HeadersDraft
	// HeadersLegacy adds RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (delta
	// seconds), as drafts 00–06 and envoyproxy/ratelimit do, plus Retry-After when denied.
	HeadersLegacy
)

// ParseHeaderMode parses "none", "draft" or "legacy".
func ParseHeaderMode(s string) (HeaderMode, error) {
	switch s {
	case "none", "":
		return HeadersNone, nil
	case "draft":
		return HeadersDraft, nil
	case "legacy":
		return HeadersLegacy, nil
	}
	return HeadersNone, fmt.Errorf("response headers %q: want none, draft or legacy", s)
}

func (m HeaderMode) String() string {
	switch m {
	case HeadersDraft:
		return "draft"
	case HeadersLegacy:
		return "legacy"
	}
	return "none"
}

func windowSeconds(l *rlsv3.RateLimitResponse_RateLimit) int64 {
	mult := int64(1)
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = int64(m.GetValue())
	}
	return limit.Unit(l.GetUnit()).Seconds() * mult
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

// LegacyHeaderNames names the three headers of HeadersLegacy; an empty name keeps its default.
type LegacyHeaderNames struct {
	Limit, Remaining, Reset string
}

// The names of HeadersLegacy's headers that an empty LegacyHeaderNames field keeps.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// withDefaults fills empty names with the defaults.
func (n LegacyHeaderNames) withDefaults() LegacyHeaderNames {
	return LegacyHeaderNames{
		Limit:     cmp.Or(n.Limit, DefaultLimitHeader),
		Remaining: cmp.Or(n.Remaining, DefaultRemainingHeader),
		Reset:     cmp.Or(n.Reset, DefaultResetHeader),
	}
}

// build returns the headers for statuses; only statuses with a current limit count. names are
// HeadersLegacy's header names, defaults filled in.
func (m HeaderMode) build(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, names LegacyHeaderNames) []*corev3.HeaderValue {
	at := func(i int) ratelimitheader.Status {
		st := statuses[i]
		l := st.GetCurrentLimit()
		if l == nil {
			return ratelimitheader.Status{}
		}
		return ratelimitheader.Status{Limited: true, Name: l.GetName(), Requests: l.GetRequestsPerUnit(),
			Window: windowSeconds(l), Remaining: st.GetLimitRemaining(), Reset: st.GetDurationUntilReset().AsDuration()}
	}
	var hs []*corev3.HeaderValue
	switch m {
	case HeadersDraft:
		policy, state, ok := ratelimitheader.Draft(len(statuses), at)
		if !ok {
			return nil
		}
		hs = append(hs, header("RateLimit-Policy", policy), header("RateLimit", state))
	case HeadersLegacy:
		limit, remaining, reset, ok := ratelimitheader.Legacy(len(statuses), at)
		if !ok {
			return nil
		}
		hs = append(hs, header(names.Limit, limit), header(names.Remaining, remaining), header(names.Reset, reset))
	default:
		return nil
	}
	// Retry-After: the longest wait of the denials that say one (a cost above the burst says
	// none: no wait admits it, and none of those alone sends the header).
	denied := false
	var retry time.Duration
	for _, st := range statuses {
		if st.GetCurrentLimit() != nil && st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && st.GetDurationUntilReset() != nil {
			denied = true
			retry = max(retry, st.GetDurationUntilReset().AsDuration())
		}
	}
	if denied {
		hs = append(hs, header("Retry-After", ratelimitheader.RetryAfter(retry)))
	}
	return hs
}
