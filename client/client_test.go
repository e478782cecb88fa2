package client_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
)

// TestMain fails the package when any goroutine outlives its tests: gRPC connections, calls
// abandoned at their deadline, and rls processes must all be gone.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rules = `
domain: test
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 3}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 60, burst: 2}
  - key: generic_key
    value: global
    rate_limit: {name: global, unit: second, requests_per_unit: 1000}
`

func newClient(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	if opts.Domain == "" {
		opts.Domain = "test"
	}
	c, err := client.New(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDecisions walks one key through its burst and past it, with a second descriptor under a
// looser limit, and checks every field of each Decision against what rls answered.
func TestDecisions(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules, Args: []string{"--response-headers", "draft"}})
	c := newClient(t, p.GRPCAddr, client.Options{Timeout: 5 * time.Second})
	key := client.Desc("api_key", "k1")
	global := client.GenericKey("global")
	steps := []struct {
		name       string
		allowed    bool
		remaining  uint32
		limitName  string
		retryAfter string // Retry-After header; "" when allowed
	}{
		{"first", true, 2, "per_key", ""},
		{"second", true, 1, "per_key", ""},
		{"third", true, 0, "per_key", ""},
		{"fourth denied", false, 0, "per_key", "1200"},
		{"fifth denied, nothing charged", false, 0, "per_key", "1200"},
	}
	for _, s := range steps {
		d, err := c.Check(ctxT(t), key, global)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if d.Allowed != s.allowed || d.Remaining != s.remaining || d.Limit.Name != s.limitName || d.Source != client.SourceRLS {
			t.Errorf("%s: allowed %v remaining %d limit %q source %v, want %v %d %q rls", s.name,
				d.Allowed, d.Remaining, d.Limit.Name, d.Source, s.allowed, s.remaining, s.limitName)
		}
		if !reflect.DeepEqual(d.Descriptor, key) {
			t.Errorf("%s: limiting descriptor %v, want %v", s.name, d.Descriptor, key)
		}
		if d.Limit != (client.Limit{Name: "per_key", Requests: 3, Window: time.Hour}) {
			t.Errorf("%s: limit %+v", s.name, d.Limit)
		}
		if len(d.Statuses) != 2 || d.Statuses[1].Limit.Name != "global" || d.Statuses[1].OverLimit {
			t.Errorf("%s: statuses %+v", s.name, d.Statuses)
		}
		// 3 per hour: one request every 20 minutes. Denied after the burst, the next is admitted
		// 20 minutes after the first, less the time the test took; Retry-After rounds it up.
		if !s.allowed && (d.RetryAfter <= 19*time.Minute || d.RetryAfter > 20*time.Minute) {
			t.Errorf("%s: RetryAfter %v, want just under 20m", s.name, d.RetryAfter)
		}
		if s.allowed && (d.RetryAfter != 0 || d.Reset <= 0 || d.Reset > time.Hour) {
			t.Errorf("%s: RetryAfter %v Reset %v", s.name, d.RetryAfter, d.Reset)
		}
		h := d.Header(client.HeadersDraft)
		if got := h.Get("Retry-After"); got != s.retryAfter {
			t.Errorf("%s: Retry-After %q, want %q", s.name, got, s.retryAfter)
		}
		// The draft headers computed here are exactly those rls emits with --response-headers draft.
		own := d
		own.RLSHeaders = nil
		if got := own.Header(client.HeadersDraft); !reflect.DeepEqual(got, d.RLSHeaders) {
			t.Errorf("%s: headers %v, rls sent %v", s.name, got, d.RLSHeaders)
		}
	}
}

func TestUnlimitedAndUnknown(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	c := newClient(t, p.GRPCAddr, client.Options{Timeout: 5 * time.Second})
	d, err := c.Check(ctxT(t), client.Desc("nothing", "matches"))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Descriptor != nil || d.Limit != (client.Limit{}) {
		t.Errorf("no rule: %+v", d)
	}
	if h := d.Header(client.HeadersDraft); len(h) != 0 {
		t.Errorf("no rule: headers %v", h)
	}
}

func TestInvalid(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	for _, policy := range []client.FailurePolicy{client.FailAllow, client.FailDeny, client.FailError} {
		c := newClient(t, p.GRPCAddr, client.Options{OnFailure: policy, Timeout: 5 * time.Second})
		for name, descs := range map[string][]client.Descriptor{
			"none":          nil,
			"empty key":     {client.Desc("", "v")},
			"no entries":    {{}},
			"invalid utf-8": {client.Desc("k", "\xff")},
		} {
			if _, err := c.Check(ctxT(t), descs...); !errors.Is(err, client.ErrInvalid) {
				t.Errorf("%v: %s: err %v, want ErrInvalid", policy, name, err)
			}
		}
	}
}

// TestNoTarget: an empty target is refused by New, rather than making every call fail and go
// to the failure policy, as if rls were down.
func TestNoTarget(t *testing.T) {
	for _, target := range []string{"", "  "} {
		if c, err := client.New(target, client.Options{Domain: "d"}); err == nil || !strings.Contains(err.Error(), "no target") {
			if c != nil {
				c.Close()
			}
			t.Errorf("New(%q): err %v, want one that says there is no target", target, err)
		}
	}
}

// TestFailurePolicies stops rls (the process gone: connections refused) or pauses it with
// SIGSTOP (connections open, nothing answers) and checks that every policy answers before the
// caller's own deadline, from the policy, and that nothing is left running afterwards.
func TestFailurePolicies(t *testing.T) {
	for _, how := range []string{"stopped", "paused"} {
		for _, policy := range []client.FailurePolicy{client.FailAllow, client.FailDeny, client.FailError} {
			t.Run(how+"/"+policy.String(), func(t *testing.T) {
				before := goleak.IgnoreCurrent()
				p := rlstest.Start(t, rlstest.Options{Rules: rules})
				c, err := client.New(p.GRPCAddr, client.Options{Domain: "test", OnFailure: policy, Timeout: 100 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				// A first call connects.
				if d, err := c.Check(ctxT(t), client.Desc("user", "u1")); err != nil || !d.Allowed || d.Source != client.SourceRLS {
					t.Fatalf("before: %+v %v", d, err)
				}
				switch how {
				case "stopped":
					p.Stop(t)
				case "paused":
					p.Pause(t)
				}
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						// The caller's deadline is long; the client's own, a quarter of it at
						// most, leaves it three quarters.
						ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
						defer cancel()
						d, err := c.Check(ctx, client.Desc("user", "u1"))
						if ctx.Err() != nil {
							t.Errorf("call %d: answered after the caller's deadline", i)
						}
						if d.Source != client.SourceFailure || d.Err == nil {
							t.Errorf("call %d: source %v err %v, want the failure policy", i, d.Source, d.Err)
						}
						switch policy {
						case client.FailAllow:
							if err != nil || !d.Allowed {
								t.Errorf("call %d: allow: %+v %v", i, d, err)
							}
						case client.FailDeny:
							if err != nil || d.Allowed || d.RetryAfter != time.Second {
								t.Errorf("call %d: deny: %+v %v", i, d, err)
							}
							if got := d.Header(client.HeadersDraft).Get("Retry-After"); got != "1" {
								t.Errorf("call %d: deny: Retry-After %q", i, got)
							}
						case client.FailError:
							if !errors.Is(err, client.ErrUnavailable) || d.Allowed {
								t.Errorf("call %d: error: %+v %v", i, d, err)
							}
						}
					}()
				}
				wg.Wait()
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				p.Stop(t)
				goleak.VerifyNone(t, before)
			})
		}
	}
}

// TestCallerDeadline: with no Timeout of its own the client keeps a quarter of the caller's time
// at most, so a paused rls still leaves the caller time to answer.
func TestCallerDeadline(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	c := newClient(t, p.GRPCAddr, client.Options{Timeout: time.Hour})
	if _, err := c.Check(ctxT(t), client.Desc("user", "u2")); err != nil {
		t.Fatal(err)
	}
	p.Pause(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d, err := c.Check(ctx, client.Desc("user", "u2"))
	if err != nil || ctx.Err() != nil || !d.Allowed || d.Source != client.SourceFailure {
		t.Errorf("paused: %+v %v (caller ctx %v)", d, err, ctx.Err())
	}
	// A caller whose context already ended gets its error, not the policy's answer.
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := c.Check(done, client.Desc("user", "u2")); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v", err)
	}
}

func TestTLS(t *testing.T) {
	certs := rlstest.NewCerts(t)
	cases := []struct {
		name       string
		serverArgs []string
		ca         string
		cert, key  string
		ok         bool
	}{
		{"tls", []string{"--grpc-tls-cert", certs.ServerCert, "--grpc-tls-key", certs.ServerKey}, certs.CA, "", "", true},
		{"mtls", []string{"--grpc-tls-cert", certs.ServerCert, "--grpc-tls-key", certs.ServerKey, "--grpc-tls-client-ca", certs.CA},
			certs.CA, certs.ClientCert, certs.ClientKey, true},
		{"mtls without a client certificate", []string{"--grpc-tls-cert", certs.ServerCert, "--grpc-tls-key", certs.ServerKey,
			"--grpc-tls-client-ca", certs.CA}, certs.CA, "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := rlstest.Start(t, rlstest.Options{Rules: rules, Args: tc.serverArgs})
			cfg, err := client.TLSConfig(tc.ca, tc.cert, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			c := newClient(t, p.GRPCAddr, client.Options{TLS: cfg, OnFailure: client.FailError, Timeout: 5 * time.Second})
			d, err := c.Check(ctxT(t), client.Desc("user", "tls"))
			if tc.ok && (err != nil || !d.Allowed || d.Limit.Name != "per_user") {
				t.Errorf("%+v %v", d, err)
			}
			if !tc.ok && !errors.Is(err, client.ErrUnavailable) {
				t.Errorf("err %v, want ErrUnavailable", err)
			}
		})
	}
}

// TestLocalTierBound: the local tier admits at most its own bucket, and rls at most its limit,
// so a flood of concurrent requests is admitted exactly local burst + rls burst times, none
// more. The local clock stands still, so the local bucket never refills; rls's limit refills
// once in 20 minutes.
func TestLocalTierBound(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newClient(t, p.GRPCAddr, client.Options{Timeout: 5 * time.Second, Local: &client.LocalTier{
		Limit: client.EachDescriptor(client.LocalLimit{Name: "local", Requests: 1, Per: time.Hour, Burst: 5}),
		Now:   func() time.Time { return t0 },
	}})
	var local, remote, denied atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				d, err := c.Check(ctxT(t), client.Desc("api_key", "flood"))
				if err != nil {
					t.Error(err)
					return
				}
				switch {
				case !d.Allowed:
					denied.Add(1)
				case d.Source == client.SourceLocal:
					local.Add(1)
				default:
					remote.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if local.Load() != 5 || remote.Load() != 3 || denied.Load() != 72 {
		t.Errorf("admitted %d locally and %d by rls, denied %d; want 5, 3 and 72", local.Load(), remote.Load(), denied.Load())
	}
}

func TestLocalDecision(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// No rls at all: the local tier answers while it has room, and the failure policy after.
	c, err := client.New("127.0.0.1:1", client.Options{Domain: "test", OnFailure: client.FailDeny, Local: &client.LocalTier{
		Limit: func(d client.Descriptor) (client.LocalLimit, bool) {
			return client.LocalLimit{Name: "local", Requests: 10, Per: time.Second, Burst: 2}, d[0].Key == "user"
		},
		Now: func() time.Time { return t0 },
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	steps := []struct {
		name   string
		descs  []client.Descriptor
		source client.Source
		remain uint32
	}{
		{"local 1", []client.Descriptor{client.Desc("user", "a")}, client.SourceLocal, 1},
		{"no local limit for api_key", []client.Descriptor{client.Desc("user", "a"), client.Desc("api_key", "k")}, client.SourceFailure, 0},
		{"local 2", []client.Descriptor{client.Desc("user", "a")}, client.SourceLocal, 0},
		{"local full", []client.Descriptor{client.Desc("user", "a")}, client.SourceFailure, 0},
		{"another key", []client.Descriptor{client.Desc("user", "b")}, client.SourceLocal, 1},
	}
	for _, s := range steps {
		d, err := c.Check(ctxT(t), s.descs...)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if d.Source != s.source || d.Remaining != s.remain || d.Allowed != (s.source == client.SourceLocal) {
			t.Errorf("%s: %+v", s.name, d)
		}
		if s.source == client.SourceLocal {
			h := d.Header(client.HeadersDraft)
			if want := `"local";q=10;w=1`; h.Get("RateLimit-Policy") != want {
				t.Errorf("%s: RateLimit-Policy %q, want %q", s.name, h.Get("RateLimit-Policy"), want)
			}
		}
	}
}

func TestLegacyHeaders(t *testing.T) {
	// Envoy's own test vector for DRAFT_VERSION_03, with X-RateLimit-Reset rounded up.
	d := client.Decision{Allowed: true, Statuses: []client.Status{
		{Limit: client.Limit{Name: "first", Requests: 1, Window: time.Minute}, Remaining: 2, Wait: 3 * time.Second},
		{Limit: client.Limit{Name: "second", Requests: 4, Window: time.Hour}, Remaining: 5, Wait: 6 * time.Second},
		{},
	}}
	want := http.Header{
		"X-Ratelimit-Limit":     {`1, 1;w=60;name="first", 4;w=3600;name="second"`},
		"X-Ratelimit-Remaining": {"2"},
		"X-Ratelimit-Reset":     {"3"},
	}
	if got := d.Header(client.HeadersLegacy); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	if got := d.Header(client.HeadersNone); len(got) != 0 {
		t.Errorf("none: %v", got)
	}
}
