// Command noop is a ShouldRateLimit server that answers OK without deciding anything: the
// baseline that load runs measure rls against, on the same machine, in the same run.
//
// With --answer full it answers as rls does for a descriptor admitted under a limit: each
// status carries the limit, what remains and when it resets. The answer is built per call, as
// rls builds it, but nothing is decided, so the difference between the two no-op servers is
// what the larger answer costs gRPC and the caller, and the difference between this one and
// rls is what deciding costs.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/durationpb"
)

type noop struct {
	rlsv3.UnimplementedRateLimitServiceServer
	full bool
}

func (n noop) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors())),
	}
	for i := range resp.Statuses {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if n.full {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
				RequestsPerUnit: 1000000000,
				Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
			}
			st.LimitRemaining = 999999999
			st.DurationUntilReset = durationpb.New(time.Nanosecond)
		}
		resp.Statuses[i] = st
	}
	return resp, nil
}

func main() {
	addr := flag.String("grpc-addr", "127.0.0.1:9081", "listen address")
	answer := flag.String("answer", "minimal", `"minimal": statuses with their code only; "full": with a limit, remaining and reset, as rls answers`)
	flag.Parse()
	if *answer != "minimal" && *answer != "full" {
		log.Fatalf("--answer %q: want minimal or full", *answer)
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, noop{full: *answer == "full"})
	reflection.Register(s)
	log.Fatal(s.Serve(l))
}
