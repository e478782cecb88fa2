package rlqs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/internal/descriptors"
)

// TestStreamsLeaveNoGoroutines: 200 streams open, report, get their assignment and end (half
// closing their side, half cut off by the client); once the server stops, none of the stream
// goroutines (the receiver, the tick) is left.
func TestStreamsLeaveNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t)
	rs, err := descriptors.Parse(map[string][]byte{"r.yaml": []byte(`domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100}
`)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Rules: func() *descriptors.RuleSet { return rs }, TTL: time.Second, Tick: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.WaitForHandlers(true)) // Stop returns once every handler has returned
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, s)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); gs.Serve(l) }()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	one := func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"k": fmt.Sprint(i % 7)}},
			TimeElapsed:        durationpb.New(time.Second),
			NumRequestsAllowed: 3,
		}}}); err != nil {
			return err
		}
		if _, err := st.Recv(); err != nil {
			return err
		}
		if i%2 == 1 {
			return nil // cancel cuts the stream off
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	for i := range 200 {
		if err := one(i); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	conn.Close()
	gs.Stop()
	<-served
	// Every handler has returned; what a stream left behind would still be running or registered.
	s.mu.Lock()
	n, nb := len(s.streams), len(s.byBucket)
	s.mu.Unlock()
	if n != 0 || nb != 0 {
		t.Errorf("%d streams and %d buckets' stream sets still registered", n, nb)
	}
}
