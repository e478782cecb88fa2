package backend_test

import (
	"context"
	"fmt"
	"time"

	"testing"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
)

func TestMemoryConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		m, err := backend.NewMemory(backend.MemoryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}

func BenchmarkMemoryDecide(b *testing.B) {
	m, err := backend.NewMemory(backend.MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// A long period keeps every key holding usage, as in steady state: no key leaves or re-enters.
	l := backend.Limit{Rate: 1 << 30, Period: 100 * 24 * time.Hour, Burst: 1 << 30}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("5:bench|6:api_key|%d", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		reqs := []backend.Request{{Limit: l, Cost: 1}}
		out := make([]backend.Decision, 1)
		i := 0
		for pb.Next() {
			reqs[0].Key = keys[i%len(keys)]
			i++
			if _, err := m.Decide(context.Background(), reqs, out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
