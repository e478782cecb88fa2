// Package ratelimitheader renders the rate-limit response headers: rls's own
// (response_headers_to_add, --response-headers) and the client's (Decision.WriteHeaders), so
// that both write the same bytes for the same answer.
//
// Two styles: the IETF draft's RateLimit-Policy and RateLimit structured fields
// (draft-ietf-httpapi-ratelimit-headers-10), one list item per limited descriptor; and the
// legacy limit, remaining and reset headers of drafts 00–06, as Envoy's
// enable_x_ratelimit_headers DRAFT_VERSION_03 and envoyproxy/ratelimit write them, for the
// limited descriptor with the fewest requests remaining. Retry-After goes with either.
package ratelimitheader

import (
	"strconv"
	"time"
)

// Status is one descriptor's answer as the headers show it.
type Status struct {
	// Limited says a limit applied; the headers leave out the other statuses.
	Limited bool
	// Name is the limit's name; the draft names an unnamed one descriptor-<its index>.
	Name      string
	Requests  uint32 // requests per window
	Window    int64  // whole seconds; the legacy limit header lists no window of 0
	Remaining uint32
	Reset     time.Duration // duration_until_reset, rounded up to whole seconds
}

// CeilSeconds rounds d up to whole seconds.
func CeilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// RetryAfter is the Retry-After value for a wait of d: whole seconds rounded up, at least 1.
func RetryAfter(d time.Duration) string { return strconv.FormatInt(max(CeilSeconds(d), 1), 10) }

// Draft renders the RateLimit-Policy and RateLimit values of the n statuses at returns
// ("per_key";q=3;w=60, "descriptor-1";q=10;w=1 and "per_key";r=2;t=20, ...); ok is false when
// none is limited, and then no header goes out.
func Draft(n int, at func(i int) Status) (policy, state string, ok bool) {
	var p, s []byte
	for i := range n {
		st := at(i)
		if !st.Limited {
			continue
		}
		if len(p) > 0 {
			p = append(p, ", "...)
			s = append(s, ", "...)
		}
		mark := len(p)
		if st.Name != "" {
			p = AppendSFString(p, st.Name)
		} else {
			p = append(p, `"descriptor-`...)
			p = strconv.AppendInt(p, int64(i), 10)
			p = append(p, '"')
		}
		s = append(s, p[mark:]...)
		p = append(p, ";q="...)
		p = strconv.AppendUint(p, uint64(st.Requests), 10)
		p = append(p, ";w="...)
		p = strconv.AppendInt(p, st.Window, 10)
		s = append(s, ";r="...)
		s = strconv.AppendUint(s, uint64(st.Remaining), 10)
		s = append(s, ";t="...)
		s = strconv.AppendInt(s, CeilSeconds(st.Reset), 10)
	}
	if len(p) == 0 {
		return "", "", false
	}
	return string(p), string(s), true
}

// Legacy renders the limit, remaining and reset values of the n statuses at returns, for the
// limited status with the fewest requests remaining (the first of equals): its requests, then
// each limited status with a window as "requests;w=window[;name="name"]" (3, 3;w=60;name="per_key");
// its remaining requests; its reset in seconds. ok is false when none is limited.
func Legacy(n int, at func(i int) Status) (limit, remaining, reset string, ok bool) {
	var m Status
	for i := range n {
		if st := at(i); st.Limited && (!ok || st.Remaining < m.Remaining) {
			m, ok = st, true
		}
	}
	if !ok {
		return "", "", "", false
	}
	b := strconv.AppendUint(nil, uint64(m.Requests), 10)
	for i := range n {
		st := at(i)
		if !st.Limited || st.Window == 0 {
			continue
		}
		b = append(b, ", "...)
		b = strconv.AppendUint(b, uint64(st.Requests), 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, st.Window, 10)
		if st.Name != "" {
			b = append(b, ";name="...)
			b = AppendSFString(b, st.Name)
		}
	}
	return string(b), strconv.FormatUint(uint64(m.Remaining), 10), strconv.FormatInt(CeilSeconds(m.Reset), 10), true
}

// AppendSFString appends s as a Structured Field string (RFC 9651): printable ASCII only, with
// '"' and '\\' escaped; any other byte becomes '?', since a field value cannot carry it.
func AppendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
