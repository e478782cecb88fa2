package httplimit_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/httplimit"
	"github.com/rls-project/rls/internal/rlstest"
)

const benchRules = `
domain: web
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: second, requests_per_unit: 1000000000}
`

// discard is a ResponseWriter that keeps nothing, so that the benchmarks measure the handler
// and the middleware, not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

func bench(b *testing.B, h http.Handler) {
	r, _ := http.NewRequest("GET", "http://example/search", nil)
	r.Header.Set("X-API-Key", "bench")
	r.RemoteAddr = "192.0.2.1:1234"
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

// BenchmarkBare is the baseline: the handler without middleware.
func BenchmarkBare(b *testing.B) { bench(b, hello) }

// BenchmarkLocalTier: the middleware on an allowed request that the local tier answers (its
// bucket never empties here), with the draft headers written.
func BenchmarkLocalTier(b *testing.B) {
	p := rlstest.Start(b, rlstest.Options{Rules: benchRules})
	c, err := client.New(p.GRPCAddr, client.Options{Domain: "web", Local: &client.LocalTier{
		Limit: client.EachDescriptor(client.LocalLimit{Name: "local", Requests: 1 << 30, Per: time.Second}),
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	lim := httplimit.New(c, httplimit.Options{})
	bench(b, lim.Handler(hello, httplimit.By(httplimit.Header("X-API-Key", "api_key"))))
}

// BenchmarkRLS: the middleware on an allowed request that asks rls (memory backend, loopback).
func BenchmarkRLS(b *testing.B) {
	p := rlstest.Start(b, rlstest.Options{Rules: benchRules})
	c, err := client.New(p.GRPCAddr, client.Options{Domain: "web", Timeout: time.Second, OnFailure: client.FailError})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	lim := httplimit.New(c, httplimit.Options{Error: func(w http.ResponseWriter, r *http.Request, err error) { b.Fatal(err) }})
	bench(b, lim.Handler(hello, httplimit.By(httplimit.Header("X-API-Key", "api_key"))))
}
