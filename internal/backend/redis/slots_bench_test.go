package redis

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/rlstest"
)

// BenchmarkSlots sets an acquire and its release (two decisions, two script calls) beside one
// GCRA decision, in the same run, on a single node: at 1 and 64 concurrent clients, with this
// process's CPU per operation (cpu-ns/op) and Redis's own time in the scripts per operation
// (redis-µs/op, INFO commandstats). An operation of "slots" is the pair; keys hold up to 10 of
// their 20 slots.
func BenchmarkSlots(b *testing.B) {
	for _, clients := range []int{1, 64} {
		for _, kind := range []string{"gcra", "slots"} {
			b.Run(fmt.Sprintf("%s/clients=%d", kind, clients), func(b *testing.B) {
				be := newTestBackend(b, singleEnv, Options{})
				gcra := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
				slots := backendtest.Slots(20, time.Minute)
				ctx := context.Background()
				if err := be.rdb.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				cpu := rlstest.ProcessCPU(b)
				var ops int64
				benchClients(b, clients, func(i int64) {
					out := make([]backend.Decision, 1)
					key := "bench-" + strconv.FormatInt(i%1000, 10)
					if kind == "gcra" {
						if ok, err := be.Decide(ctx, []backend.Request{{Key: key, Limit: gcra, Cost: 1}}, out); err != nil || !ok {
							b.Fatalf("admitted=%v err=%v", ok, err)
						}
						return
					}
					id := strconv.FormatInt(i, 10)
					if ok, err := be.Decide(ctx, []backend.Request{{Key: key, Limit: slots, Cost: 1, Slot: id}}, out); err != nil || !ok {
						b.Fatalf("acquire: admitted=%v err=%v", ok, err)
					}
					if _, err := be.Decide(ctx, []backend.Request{{Key: key, Limit: slots, Cost: 1, Slot: id, Refund: true}}, out); err != nil {
						b.Fatal(err)
					}
				})
				ops = int64(b.N)
				rlstest.ReportCPU(b, cpu)
				b.ReportMetric(scriptUsec(b, be)/float64(ops), "redis-µs/op")
			})
		}
	}
}
