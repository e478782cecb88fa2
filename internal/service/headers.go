package service

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
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

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

func windowSeconds(l *rlsv3.RateLimitResponse_RateLimit) int64 {
	mult := int64(1)
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = int64(m.GetValue())
	}
	return unitSeconds(l.GetUnit()) * mult
}

func unitSeconds(u rlsv3.RateLimitResponse_RateLimit_Unit) int64 {
	switch u {
	case rlsv3.RateLimitResponse_RateLimit_SECOND:
		return 1
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		return 60
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		return 3600
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		return 86400
	case rlsv3.RateLimitResponse_RateLimit_WEEK:
		return 7 * 86400
	case rlsv3.RateLimitResponse_RateLimit_MONTH:
		return 30 * 86400
	case rlsv3.RateLimitResponse_RateLimit_YEAR:
		return 365 * 86400
	}
	return 0
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

// LegacyHeaderNames names the three headers of HeadersLegacy; an empty name keeps its default.
type LegacyHeaderNames struct {
	Limit, Remaining, Reset string
}

// withDefaults fills empty names with RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
func (n LegacyHeaderNames) withDefaults() LegacyHeaderNames {
	return LegacyHeaderNames{
		Limit:     cmp.Or(n.Limit, "RateLimit-Limit"),
		Remaining: cmp.Or(n.Remaining, "RateLimit-Remaining"),
		Reset:     cmp.Or(n.Reset, "RateLimit-Reset"),
	}
}

// build returns the headers for statuses; only statuses with a current limit count. names are
// HeadersLegacy's header names, defaults filled in.
func (m HeaderMode) build(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, names LegacyHeaderNames) []*corev3.HeaderValue {
	var hs []*corev3.HeaderValue
	minIdx := -1
	var retry time.Duration
	denied := false
	var policy, state strings.Builder
	for i, st := range statuses {
		l := st.GetCurrentLimit()
		if l == nil {
			continue
		}
		if minIdx < 0 || st.GetLimitRemaining() < statuses[minIdx].GetLimitRemaining() {
			minIdx = i
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			denied = true
			retry = max(retry, st.GetDurationUntilReset().AsDuration())
		}
		if m == HeadersDraft {
			id := l.GetName()
			if id == "" {
				id = "descriptor-" + strconv.Itoa(i)
			}
			if policy.Len() > 0 {
				policy.WriteString(", ")
				state.WriteString(", ")
			}
			fmt.Fprintf(&policy, "%s;q=%d;w=%d", sfString(id), l.GetRequestsPerUnit(), windowSeconds(l))
			fmt.Fprintf(&state, "%s;r=%d;t=%d", sfString(id), st.GetLimitRemaining(), ceilSeconds(st.GetDurationUntilReset().AsDuration()))
		}
	}
	if minIdx < 0 {
		return nil
	}
	switch m {
	case HeadersDraft:
		hs = append(hs, header("RateLimit-Policy", policy.String()), header("RateLimit", state.String()))
	case HeadersLegacy:
		st := statuses[minIdx]
		var limit strings.Builder
		fmt.Fprintf(&limit, "%d", st.GetCurrentLimit().GetRequestsPerUnit())
		for _, s := range statuses {
			if l := s.GetCurrentLimit(); l != nil {
				fmt.Fprintf(&limit, ", %d;w=%d", l.GetRequestsPerUnit(), windowSeconds(l))
				if l.GetName() != "" {
					fmt.Fprintf(&limit, ";name=%s", sfString(l.GetName()))
				}
			}
		}
		hs = append(hs,
			header(names.Limit, limit.String()),
			header(names.Remaining, strconv.FormatUint(uint64(st.GetLimitRemaining()), 10)),
			header(names.Reset, strconv.FormatInt(ceilSeconds(st.GetDurationUntilReset().AsDuration()), 10)))
	}
	if denied {
		hs = append(hs, header("Retry-After", strconv.FormatInt(max(ceilSeconds(retry), 1), 10)))
	}
	return hs
}

// sfString renders s as a Structured Field string (RFC 9651): printable ASCII only, with '"'
// and '\\' escaped; any other byte becomes '?', since a field value cannot carry it.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
