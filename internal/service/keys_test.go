package service

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/descriptors"
)

func keysRequest(t *testing.T, h http.Handler, method, query, token string) (*httptest.ResponseRecorder, KeysResult) {
	t.Helper()
	r := httptest.NewRequest(method, "/v1/keys?"+query, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var res KeysResult
	if w.Code == http.StatusOK {
		if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
			t.Fatalf("%s: %v", w.Body, err)
		}
	}
	return w, res
}

func TestKeysHandler(t *testing.T) {
	f := newUsageFixture(t)
	f.ask(t, 0, tokens("api_key", "m", u64(800)))
	f.ask(t, 0, tokens("api_key", "m", u64(5000)))
	f.ask(t, 0, tokens("api_key", "other", u64(10)))
	const q = "domain=ai&descriptor=api_key=k1,model=m"
	var logs strings.Builder
	on := f.svc.KeysHandler(KeysOptions{AdminToken: []byte("s3cret"), Logger: testLogger(&logs)})
	off := f.svc.KeysHandler(KeysOptions{})

	inspect := func(h http.Handler) KeyLimit {
		t.Helper()
		w, res := keysRequest(t, h, http.MethodGet, q, "")
		if w.Code != http.StatusOK || len(res.Descriptors) != 1 || len(res.Descriptors[0].Limits) != 1 {
			t.Fatalf("inspect: %d %s", w.Code, w.Body)
		}
		// Entries are snake_case like every other field, and like the descriptors /json takes.
		var compact bytes.Buffer
		if err := json.Compact(&compact, w.Body.Bytes()); err != nil || !strings.Contains(compact.String(), `"entries":[{"key":"api_key","value":"k1"},{"key":"model","value":"m"}]`) {
			t.Fatalf("inspect: entries not as {key, value}: %s", w.Body)
		}
		return res.Descriptors[0].Limits[0]
	}
	want := KeyLimit{RequestsPerUnit: 1000, Unit: "minute", UnitMultiplier: 1, Burst: 1000, Overdraft: true, Algorithm: "gcra",
		ResetAfter: 348, InDebt: true, Debt: 4800, RepaidAfter: 288}
	for range 2 { // reading charges nothing
		if got := inspect(off); got != want {
			t.Fatalf("inspect: %+v, want %+v", got, want)
		}
	}
	for _, tc := range []struct {
		name   string
		h      http.Handler
		method string
		token  string
		code   int
	}{
		{"no token file: 404", off, http.MethodPost, "s3cret", http.StatusNotFound},
		{"no token file, DELETE: 404", off, http.MethodDelete, "", http.StatusNotFound},
		{"no token: 403", on, http.MethodPost, "", http.StatusForbidden},
		{"wrong token: 403", on, http.MethodDelete, "s3cre", http.StatusForbidden},
		{"longer token: 403", on, http.MethodDelete, "s3cret2", http.StatusForbidden},
		{"PUT: 405", on, http.MethodPut, "s3cret", http.StatusMethodNotAllowed},
	} {
		if w, _ := keysRequest(t, tc.h, tc.method, q, tc.token); w.Code != tc.code {
			t.Fatalf("%s: %d %s, want %d", tc.name, w.Code, w.Body, tc.code)
		}
		if got := inspect(off); got != want {
			t.Fatalf("%s: state changed: %+v", tc.name, got)
		}
	}
	w, res := keysRequest(t, on, http.MethodPost, q, "s3cret")
	if w.Code != http.StatusOK || res.Reset != 1 || res.Descriptors[0].Limits[0].Remaining != 1000 || res.Descriptors[0].Limits[0].InDebt {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	if r := f.ask(t, 0, tokens("api_key", "m", u64(0))); codesOf(r) != "OK OK" {
		t.Fatalf("check after reset: %v", r)
	}
	_, other := keysRequest(t, off, http.MethodGet, "domain=ai&descriptor=api_key=k1,model=other", "")
	if l := other.Descriptors[0].Limits[0]; l.Remaining != 990 {
		t.Fatalf("another key after reset: %+v, want untouched", l)
	}
	if s := logs.String(); strings.Contains(s, "s3cre") || !strings.Contains(s, "keys reset") || !strings.Contains(s, "remote=") {
		t.Fatalf("logs: %s", s)
	}
	for _, q := range []string{"domain=ai", "domain=ai&descriptor=novalue", "descriptor=a=b", "domain=ai&descriptor=a=%zz"} {
		if w, _ := keysRequest(t, off, http.MethodGet, q, ""); w.Code != http.StatusBadRequest {
			t.Fatalf("%s: %d, want 400", q, w.Code)
		}
	}
	// No rule: no limits, and nothing to reset.
	if w, res := keysRequest(t, on, http.MethodDelete, "domain=ai&descriptor=nope=x", "s3cret"); w.Code != http.StatusOK || res.Reset != 0 || len(res.Descriptors[0].Limits) != 0 {
		t.Fatalf("no rule: %d %s", w.Code, w.Body)
	}
}

func testLogger(w *strings.Builder) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// TestDescriptorTextReadsBack: what rls writes as a descriptor's text (the debug log, replay's
// report, /debug/top) reads back as the same descriptor in rls check and /v1/keys, whatever its
// keys and values hold.
func TestDescriptorTextReadsBack(t *testing.T) {
	for _, entries := range [][]descriptors.Entry{
		{{Key: "user", Value: "alice"}},
		{{Key: "path", Value: "/a,b=c"}, {Key: "q%", Value: "100%25"}},
		{{Key: "k", Value: ""}, {Key: "=", Value: ",,"}, {Key: "é", Value: "%2C"}},
	} {
		text := descriptors.Text(entries)
		d, err := ParseDescriptor(text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		var got []descriptors.Entry
		for _, e := range d.Entries {
			got = append(got, descriptors.Entry{Key: e.Key, Value: e.Value})
		}
		if !slices.Equal(got, entries) {
			t.Errorf("%q reads back as %v, want %v", text, got, entries)
		}
	}
}
