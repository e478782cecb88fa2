package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestExample runs the example against rls on its embedded default rules, as docs/go-client.md says.
func TestExample(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{})
	c, err := client.New(p.GRPCAddr, client.Options{Domain: "example", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := newHandler(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer http.DefaultClient.CloseIdleConnections()
	get := func(method, path, key string) (int, http.Header) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	// 5 login attempts a minute per IP: the sixth waits 12 s, the interval between two.
	for i := range 6 {
		code, h := get("POST", "/login", "")
		want := 200
		if i == 5 {
			want = 429
		}
		if code != want {
			t.Fatalf("login %d: %d, want %d", i, code, want)
		}
		if i == 5 && h.Get("Retry-After") != "12" {
			t.Errorf("login %d: Retry-After %q, want 12", i, h.Get("Retry-After"))
		}
		if i == 0 && h.Get("RateLimit-Policy") != `"login_per_ip";q=5;w=60, "global";q=1000;w=1` {
			t.Errorf("login %d: RateLimit-Policy %q", i, h.Get("RateLimit-Policy"))
		}
	}
	// Bursts of 10 per API key.
	for i := range 11 {
		code, _ := get("GET", "/hello", "k1")
		if want := map[bool]int{true: 429, false: 200}[i == 10]; code != want {
			t.Fatalf("hello %d: %d, want %d", i, code, want)
		}
	}
}
