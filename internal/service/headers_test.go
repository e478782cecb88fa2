package service

import (
	"testing"
)

func headerMap(t *testing.T, f *fixture, n int) map[string]string {
	t.Helper()
	var m map[string]string
	for range n {
		r := f.ask(t, desc("key", "h"), desc("plan", "free"))
		m = map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			if _, dup := m[h.Key]; dup {
				t.Fatalf("header %s twice", h.Key)
			}
			m[h.Key] = h.Value
		}
	}
	return m
}

func TestHeaders(t *testing.T) {
	tests := []struct {
		name string
		mode HeaderMode
		n    int
		want map[string]string
	}{
		{"none", HeadersNone, 1, map[string]string{}},
		{"draft", HeadersDraft, 1, map[string]string{
			"RateLimit-Policy": `"per_key";q=3;w=60, "free_daily";q=3;w=86400`,
			"RateLimit":        `"per_key";r=2;t=20, "free_daily";r=2;t=28800`,
		}},
		{"legacy", HeadersLegacy, 1, map[string]string{
			"RateLimit-Limit":     `3, 3;w=60;name="per_key", 3;w=86400;name="free_daily"`,
			"RateLimit-Remaining": "2",
			"RateLimit-Reset":     "20",
		}},
		{"legacy denied adds Retry-After", HeadersLegacy, 4, map[string]string{
			"RateLimit-Limit":     `3, 3;w=60;name="per_key", 3;w=86400;name="free_daily"`,
			"RateLimit-Remaining": "0",
			"RateLimit-Reset":     "20",
			"Retry-After":         "28800",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Options{Headers: tc.mode})
			got := headerMap(t, f, tc.n)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestLegacyHeaderNames(t *testing.T) {
	f := newFixture(t, Options{Headers: HeadersLegacy, LegacyHeaderNames: LegacyHeaderNames{
		Limit: "X-RateLimit-Limit", Remaining: "X-RateLimit-Remaining", // Reset left at its default
	}})
	got := headerMap(t, f, 1)
	for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Reset"} {
		if _, ok := got[k]; !ok {
			t.Errorf("headers %v: no %s", got, k)
		}
	}
	if len(got) != 3 {
		t.Errorf("headers %v, want three", got)
	}
}
