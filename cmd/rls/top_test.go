package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/top"
)

// TestTopFlagsExit64: serve's --top-* values out of range and rls top's bad flags are usage
// errors, before anything starts.
func TestTopFlagsExit64(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	serve := []string{"--grpc-addr", busy.Addr().String(), "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(serve, "--top-keys", "-1"), "--top-keys -1: want 0 (off) to 4096"},
		{append(serve, "--top-keys", "5000"), "--top-keys 5000: want 0 (off) to 4096"},
		{append(serve, "--top-max-bytes", "1000"), "--top-max-bytes 1000: one rule's counters need 296960 with --top-keys 64"},
		{[]string{"top", "--window", "5m"}, "--window: want 1m or 10m"},
		{[]string{"top", "--sort", "size"}, "--sort: want denials or hits"},
		{[]string{"top", "--keys", "0"}, "--keys: want a number ≥ 1"},
		{[]string{"top", "--interval", "0s"}, "--interval 0s: want a positive duration"},
		{[]string{"top", "extra"}, `unexpected arguments ["extra"]`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var stderr bytes.Buffer
		code := exitCode(run(ctx, c.args, nil, io.Discard, &stderr), &stderr)
		cancel()
		if code != 64 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 64 and %q", c.args, code, stderr.String(), c.want)
		}
	}
}

// TestTopOnce: rls top --once prints one screen, uncleared, from /debug/top, with the query its
// flags ask; a server that cannot be read is exit 1.
func TestTopOnce(t *testing.T) {
	t.Parallel()
	tp := top.New(top.Config{Keys: 4, MaxBytes: top.DefaultMaxBytes})
	long := strings.Repeat("v", 80)
	for i := range 3 {
		key := "1:d4:user" + map[int]string{0: "1:a", 1: "1:b", 2: "80:" + long}[i] + "#0"
		tp.Observe(time.Now(), &top.Observation{Domain: "d", Rule: "user", Key: key, Cost: int64(3 - i), Denied: i == 0, Remaining: 0, Limit: 2})
	}
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		tp.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"top", "--once", "--debug-url", srv.URL, "--rule", "user", "--sort", "hits", "--keys", "3"}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	out := stdout.String()
	if query != "keys=3&rule=user&sort=hits&window=1m" {
		t.Errorf("query %q", query)
	}
	for _, want := range []string{
		"rls top  " + srv.URL + "  window 1m since ",
		"\nd · user   6 hits  3 denied  error ≤ 0\n",
		"\n  user=a                                                    3          3        0          0        2\n",
		"\n  user=" + strings.Repeat("v", 42) + "…          1          0        0          0        2\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("screen lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("--once cleared the screen: %q", out)
	}
	srv.Close()
	stderr.Reset()
	if code := exitCode(run(context.Background(), []string{"top", "--once", "--debug-url", srv.URL}, nil, io.Discard, &stderr), &stderr); code != 1 {
		t.Errorf("server gone: exit %d, want 1 (%s)", code, stderr.String())
	}
}
