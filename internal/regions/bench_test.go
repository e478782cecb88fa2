package regions

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// BenchmarkLimit is what a decision on a global limit adds in this process: the region's share
// looked up in the replica's table and the demand counted (go test -bench Limit -cpu 1,8).
func BenchmarkLimit(b *testing.B) {
	n := &Node{start: time.Now(), demand: map[string]*demandCount{}, cfg: Config{TableLease: time.Hour}}
	shares := map[string]Share{}
	keys := make([]string, 100000)
	for i := range keys {
		keys[i] = fmt.Sprintf("4:shop4:user9:user-%05d#0", i)
		shares[keys[i]] = Share{50, 10}
	}
	n.view.Store(NewView(Published{Shares: shares, ValidUntil: int64(time.Hour)}, 0, n.mono(), time.Hour, Policy{}))
	l := limit.Limit{Rate: 100, Period: time.Second, Burst: 20, Shared: true}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, _, err := n.Limit(ctx, keys[i%len(keys)], l, 1); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
