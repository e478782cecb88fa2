package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestStreamWorkersBusy: calls that find every stream worker taken, here by RLQS streams that
// hold theirs for as long as they stay open, are still served, on goroutines of their own.
func TestStreamWorkersBusy(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--grpc-stream-workers", "2")
	q := rlqsClient(t, p.GRPCAddr)
	for i := range 3 {
		s, err := q.StreamRateLimitQuotas(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		exchange(t, s, &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"api_key": fmt.Sprintf("key-%d", i)}, 1, 0, time.Second)}})
	}
	c := p.client(t)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rlqs", Descriptors: oneDesc(d("api_key", "shared"))})
			if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("overall code %v, want OK", resp.GetOverallCode())
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamWorkersStarted: --grpc-stream-workers reaches the gRPC server: an idle process keeps
// that many more goroutines than one without workers.
func TestStreamWorkersStarted(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	none := goroutines(t, startRLS(t, nil, "--config", rules, "--grpc-stream-workers", "0"))
	many := goroutines(t, startRLS(t, nil, "--config", rules, "--grpc-stream-workers", "300"))
	// Both idle, started alike: they differ by the workers, give or take a goroutine that a
	// connection or a timer holds at the moment of reading.
	if d := many - none; d < 290 || d > 310 {
		t.Fatalf("goroutines: %d with 300 workers, %d without; want about 300 more", many, none)
	}
}
