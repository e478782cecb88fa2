package ratelimitheader

import (
	"testing"
	"time"
)

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, time.Nanosecond: 1, time.Second: 1, 1500 * time.Millisecond: 2} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1", time.Nanosecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", time.Hour: "3600"} {
		if got := RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestSFString(t *testing.T) {
	tests := map[string]string{
		"plain":       `"plain"`,
		`a"b\c`:       `"a\"b\\c"`,
		"caf\u00e9\n": `"caf???"`, // two UTF-8 bytes and a newline
	}
	for in, want := range tests {
		if got := string(AppendSFString([]byte("x"), in)); got != "x"+want {
			t.Errorf("AppendSFString(%q) = %s, want x%s", in, got, want)
		}
	}
}

// TestStyles renders both styles from one list of statuses: an unlimited one is left out, an
// unnamed one is named by its index in the draft, a window under a second is listed by the
// draft (w=0) but not by the legacy limit header, and the legacy headers follow the status
// with the fewest remaining, the first of equals.
func TestStyles(t *testing.T) {
	sts := []Status{
		{Limited: true, Name: "per_key", Requests: 3, Window: 3600, Remaining: 2, Reset: 1200 * time.Second},
		{},
		{Limited: true, Requests: 10, Window: 0, Remaining: 1, Reset: 50 * time.Millisecond},
		{Limited: true, Name: `q"uote`, Requests: 5, Window: 60, Remaining: 1, Reset: 1500 * time.Millisecond},
	}
	at := func(i int) Status { return sts[i] }
	policy, state, ok := Draft(len(sts), at)
	if want := `"per_key";q=3;w=3600, "descriptor-2";q=10;w=0, "q\"uote";q=5;w=60`; !ok || policy != want {
		t.Errorf("policy %q %v, want %q", policy, ok, want)
	}
	if want := `"per_key";r=2;t=1200, "descriptor-2";r=1;t=1, "q\"uote";r=1;t=2`; state != want {
		t.Errorf("state %q, want %q", state, want)
	}
	limit, remaining, reset, ok := Legacy(len(sts), at)
	if want := `10, 3;w=3600;name="per_key", 5;w=60;name="q\"uote"`; !ok || limit != want || remaining != "1" || reset != "1" {
		t.Errorf("legacy %q %q %q %v, want %q 1 1", limit, remaining, reset, ok, want)
	}
	none := func(int) Status { return Status{} }
	if p, s, ok := Draft(2, none); ok || p != "" || s != "" {
		t.Errorf("draft of nothing limited: %q %q %v", p, s, ok)
	}
	if l, r, z, ok := Legacy(2, none); ok || l != "" || r != "" || z != "" {
		t.Errorf("legacy of nothing limited: %q %q %q %v", l, r, z, ok)
	}
}
