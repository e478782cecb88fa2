package server

import (
	"context"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// defaultGRPCMaxCalls is the default of --grpc-max-calls: no bound. Counting calls takes a
// stats handler, whose work on every call kept an ordinary caller beside a flood of callers
// with 1 ms deadlines past its own deadline now and then on 2 CPUs, so it is asked for where
// the memory budget needs it (the Kubernetes manifest: 1024).
const defaultGRPCMaxCalls = 0

// callLimit bounds the ShouldRateLimit calls open at once in the whole process, over every
// connection. gRPC reads a call's message whole before any handler or interceptor runs, up to
// --max-request-bytes, so without it the memory of messages being received would be bounded
// only by connections × streams per connection × message size. A call past the bound is
// refused as it opens, before its message is read: UNAVAILABLE, which Envoy answers with its
// failure_mode_deny, counted in rls_grpc_calls_refused_total.
type callLimit struct {
	max     int64
	open    atomic.Int64
	refused prometheus.Counter
}

// newCallLimit returns the bound as a server option, its metrics registered on reg; no option
// when max is 0.
func newCallLimit(max int64, reg prometheus.Registerer) ([]grpc.ServerOption, error) {
	if max == 0 {
		return nil, nil
	}
	l := &callLimit{max: max, refused: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rls_grpc_calls_refused_total",
		Help: "ShouldRateLimit calls refused as they opened because --grpc-max-calls were open already.",
	})}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rls_grpc_calls_open", Help: "ShouldRateLimit calls open (at most --grpc-max-calls).",
	}, func() float64 { return float64(l.open.Load()) })
	for _, c := range []prometheus.Collector{l.refused, open} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return []grpc.ServerOption{grpc.InTapHandle(l.tap), grpc.StatsHandler(callEnds{l})}, nil
}

// errTooManyCalls is the answer to a call past the bound.
var errTooManyCalls = status.Error(codes.Unavailable, "rls overloaded: too many calls open (--grpc-max-calls)")

// tap runs as a call opens, before its message is read, and refuses a ShouldRateLimit call
// while the bound's calls are open. A call counts as open from its stats.Begin, which gRPC
// emits before it reads the call's message, to its stats.End, both on the call's own goroutine:
// a call aborted before it began is never counted, so none is counted for ever. A call is
// counted once its handler starts, after the tap let it in, so calls opening in a burst may
// pass the bound together by as many as opened before the first of them started.
func (l *callLimit) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName && l.open.Load() >= l.max {
		l.refused.Inc()
		return nil, errTooManyCalls
	}
	return ctx, nil
}

// callEnds is the stats handler that counts ShouldRateLimit calls open.
type callEnds struct{ l *callLimit }

type countedKey struct{}

func (callEnds) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if info.FullMethodName == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
		return context.WithValue(ctx, countedKey{}, true)
	}
	return ctx
}
func (callEnds) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (callEnds) HandleConn(context.Context, stats.ConnStats) {}

func (e callEnds) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.Begin:
		if ctx.Value(countedKey{}) != nil {
			e.l.open.Add(1)
		}
	case *stats.End:
		if ctx.Value(countedKey{}) != nil {
			e.l.open.Add(-1)
		}
	}
}
