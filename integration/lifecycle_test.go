package integration

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
)

// call is one ShouldRateLimit call of the steady load, with when it started.
type call struct {
	start time.Time
	err   error
}

// TestSIGTERMDrains sends SIGTERM to rls while calls run and checks the shutdown sequence:
// health (gRPC Watch and Check, /readyz) says NOT_SERVING at once; for --shutdown-delay rls
// goes on accepting connections and answering; then it drains, and a call that was open across
// the whole sequence (its request sent only after the drain began) completes; rls exits 0
// without having to force anything closed.
func TestSIGTERMDrains(t *testing.T) {
	const delay = time.Second
	rules := writeRules(t, map[string]string{"life.yaml": `
domain: life
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000}
`})
	p := startRLS(t, nil, "--config", rules, "--shutdown-delay", delay.String(), "--shutdown-timeout", "10s")
	req := &rlsv3.RateLimitRequest{Domain: "life", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("k", "v")}}
	dial := func() *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	// A health watch, as gRPC clients with client-side health checking keep open.
	hconn := dial()
	health := healthpb.NewHealthClient(hconn)
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch, err := health.Watch(wctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health watch before SIGTERM: %v, %v; want SERVING", resp, err)
	}
	notServing := make(chan time.Time, 1)
	go func() {
		for {
			resp, err := watch.Recv()
			if err != nil {
				return
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
				notServing <- time.Now()
				return
			}
		}
	}()

	// A call in flight for the whole shutdown: its headers are sent now, its request after the
	// drain has begun.
	open := dialH2(t, p.GRPCAddr)
	open.openCall()

	// The steady load: every call is recorded with its start.
	client := rlsv3.NewRateLimitServiceClient(dial())
	var (
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-p.Done():
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := client.ShouldRateLimit(ctx, req)
				cancel()
				mu.Lock()
				calls = append(calls, call{start, err})
				mu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond) // rls is gone; do not spin
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)

	sigterm := time.Now()
	p.Signal(t, syscall.SIGTERM)
	var flipped time.Time
	select {
	case flipped = <-notServing:
	case <-time.After(delay / 2):
		t.Fatalf("the health watch did not report NOT_SERVING within %v of SIGTERM", delay/2)
	}
	// The watch stays open: rls ends health watches when it drains, so it cannot hold the drain.
	if resp, err := health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health check during the delay: %v, %v; want NOT_SERVING", resp, err)
	}
	resp, err := http.Get("http://" + p.HTTPAddr + "/readyz")
	if err != nil {
		t.Fatalf("/readyz during the delay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the delay: %d, want 503", resp.StatusCode)
	}
	// Health flipped, yet rls still accepts new connections and answers on them.
	if _, err := rlsv3.NewRateLimitServiceClient(dial()).ShouldRateLimit(ctxT(t), req); err != nil {
		t.Errorf("a new connection during the delay: %v", err)
	}
	checked := time.Now()

	var drain time.Time
	select {
	case <-open.goaway:
		drain = time.Now()
	case <-open.readerEnd:
		t.Fatalf("rls closed the connection of the call in flight without a GOAWAY\n%s", p.Output())
	case <-time.After(delay + 10*time.Second):
		t.Fatal("no GOAWAY on the open call's connection")
	}
	if drain.Sub(sigterm) < delay {
		t.Errorf("draining began %v after SIGTERM, before the %v delay", drain.Sub(sigterm), delay)
	}
	if !checked.Before(drain) {
		t.Errorf("the health checks ended %v after draining began; the delay was not kept", checked.Sub(drain))
	}
	select {
	case <-p.Done():
		t.Fatalf("rls exited with a call in flight: %v\n%s", p.ExitErr(), p.Output())
	case <-time.After(100 * time.Millisecond):
	}
	if st := open.finishCall(req); st != "0" {
		t.Errorf("the call in flight across the shutdown ended with grpc-status %q, want 0", st)
	}

	select {
	case <-p.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("rls did not exit after draining\n%s", p.Output())
	}
	if err := p.ExitErr(); err != nil {
		t.Errorf("rls exited with %v\n%s", err, p.Output())
	}
	if out := p.Output(); strings.Contains(out, "did not finish in time") {
		t.Errorf("rls forced calls closed:\n%s", out)
	}
	wg.Wait()

	var before, during, unavailable int
	for _, c := range calls {
		switch {
		case c.start.Before(sigterm.Add(delay / 2)):
			// Started before SIGTERM, or well inside the delay: rls answers these.
			if c.err != nil {
				t.Errorf("call started %v after SIGTERM failed: %v", c.start.Sub(sigterm), c.err)
			}
			if c.start.Before(sigterm) {
				before++
			} else {
				during++
			}
		case status.Code(c.err) == codes.Unavailable:
			unavailable++
		case c.err != nil:
			t.Errorf("call started %v after SIGTERM failed with %v; only UNAVAILABLE is allowed once rls drains", c.start.Sub(sigterm), c.err)
		}
	}
	if before == 0 || during == 0 {
		t.Errorf("calls started before SIGTERM: %d, during the delay: %d; want some of each", before, during)
	}
	t.Logf("NOT_SERVING %v after SIGTERM, drain at %v; %d calls before SIGTERM, %d in the first half of the delay, %d of %d UNAVAILABLE after",
		flipped.Sub(sigterm).Round(time.Millisecond), drain.Sub(sigterm).Round(time.Millisecond), before, during, unavailable, len(calls))
}

// TestShutdownWithRedisStalled: on SIGTERM, a Redis that has stopped answering (CLIENT PAUSE)
// keeps rls no longer than --shutdown-timeout plus the 1.2 s the cancelled calls and closing the
// backend may take, though the pipeline in flight would wait for Redis for the socket's 5 s read
// timeout, and a lone call reading its own reply (the coalescer's leader) waits up to its 5 s
// deadline without watching its cancellation.
func TestShutdownWithRedisStalled(t *testing.T) {
	r := redistest.Start(t)
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": coreRules}),
		"--backend", "redis", "--redis-url", r.URL(), "--redis-timeout", "5s", "--redis-read-timeout", "5s",
		"--shutdown-delay", "0s", "--shutdown-timeout", "500ms")
	c := p.client(t)
	ask := func() error {
		_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "s"}}}}})
		return err
	}
	if err := ask(); err != nil {
		t.Fatal(err)
	}
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "6000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	for range 8 {
		go ask() // in flight, waiting for Redis
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	p.Signal(t, syscall.SIGTERM)
	select {
	case <-p.Done():
		t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(4 * time.Second):
		t.Fatalf("rls still running 4 s after SIGTERM with --shutdown-timeout 500ms\n%s", p.Output())
	}
}
