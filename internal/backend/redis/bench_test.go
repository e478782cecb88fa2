package redis

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
)

// benchClients runs body from clients goroutines in all (one: a plain loop).
func benchClients(b *testing.B, clients int, body func(i int64)) {
	var n atomic.Int64
	if clients == 1 {
		for b.Loop() {
			body(n.Add(1))
		}
		return
	}
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body(n.Add(1))
		}
	})
}

// BenchmarkDecide measures one-request batches on distinct keys (the admitted path), with and
// without coalescing, at 1, 8 and 64 concurrent clients, on a single node and on the Cluster.
func BenchmarkDecide(b *testing.B) {
	for _, topo := range []struct{ name, env string }{{"single", singleEnv}, {"cluster", clusterEnv}} {
		for _, co := range []struct {
			name string
			opts Options
		}{
			{"direct", Options{}},
			{"coalesced", Options{Coalesce: 64, CoalescePipelines: 1}},
			{"coalesced-2", Options{Coalesce: 64, CoalescePipelines: 2}},
		} {
			for _, clients := range []int{1, 8, 64} {
				b.Run(fmt.Sprintf("%s/%s/clients=%d", topo.name, co.name, clients), func(b *testing.B) {
					be := newTestBackend(b, topo.env, co.opts)
					l := backend.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
					b.ReportAllocs()
					benchClients(b, clients, func(i int64) {
						out := make([]backend.Decision, 1)
						ok, err := be.Decide(context.Background(), []backend.Request{{Key: "bench-" + strconv.FormatInt(i%10000, 10), Limit: l, Cost: 1}}, out)
						if err != nil || !ok {
							b.Fatalf("admitted=%v err=%v", ok, err)
						}
					})
				})
			}
		}
	}
}

// BenchmarkDecideDenied measures a hot denied key, with and without the local cache.
func BenchmarkDecideDenied(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts Options
	}{{"redis", Options{}}, {"cached", Options{LocalCacheSize: 1000}}} {
		for _, clients := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", tc.name, clients), func(b *testing.B) {
				be := newTestBackend(b, singleEnv, tc.opts)
				l := backend.Limit{Rate: 1, Period: time.Hour, Burst: 1}
				req := []backend.Request{{Key: "hot", Limit: l, Cost: 1}}
				be.Decide(context.Background(), req, make([]backend.Decision, 1))
				b.ReportAllocs()
				benchClients(b, clients, func(int64) {
					out := make([]backend.Decision, 1)
					ok, err := be.Decide(context.Background(), req, out)
					if err != nil || ok {
						b.Fatalf("admitted=%v err=%v", ok, err)
					}
				})
			})
		}
	}
}

// BenchmarkDecideBatch measures five-descriptor requests, which a Cluster splits over slots.
func BenchmarkDecideBatch(b *testing.B) {
	for _, topo := range []struct{ name, env string }{{"single", singleEnv}, {"cluster", clusterEnv}} {
		b.Run(topo.name, func(b *testing.B) {
			be := newTestBackend(b, topo.env, Options{})
			l := backend.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
			b.ReportAllocs()
			benchClients(b, 8, func(i int64) {
				reqs := make([]backend.Request, 5)
				for k := range reqs {
					reqs[k] = backend.Request{Key: fmt.Sprintf("batch-%d-%d", i%1000, k), Limit: l, Cost: 1}
				}
				out := make([]backend.Decision, len(reqs))
				if ok, err := be.Decide(context.Background(), reqs, out); err != nil || !ok {
					b.Fatalf("admitted=%v err=%v", ok, err)
				}
			})
		})
	}
}
