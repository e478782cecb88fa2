package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
)

// BenchmarkCheck is the end-to-end cost of one call to rls: Check with one descriptor against
// the real binary on the memory backend, over loopback.
func BenchmarkCheck(b *testing.B) {
	p := rlstest.Start(b, rlstest.Options{Rules: `
domain: test
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: second, requests_per_unit: 1000000000}
`})
	c, err := client.New(p.GRPCAddr, client.Options{Domain: "test", Timeout: time.Second, OnFailure: client.FailError})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	d := client.Desc("api_key", "bench")
	b.ReportAllocs()
	for b.Loop() {
		if dec, err := c.Check(ctx, d); err != nil || !dec.Allowed {
			b.Fatal(dec, err)
		}
	}
}

// BenchmarkCheckLocal is Check answered by the local tier.
func BenchmarkCheckLocal(b *testing.B) {
	c, err := client.New("127.0.0.1:1", client.Options{Domain: "test", Local: &client.LocalTier{
		Limit: client.EachDescriptor(client.LocalLimit{Requests: 1 << 30, Per: time.Second}),
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	d := client.Desc("api_key", "bench")
	b.ReportAllocs()
	for b.Loop() {
		if dec, err := c.Check(ctx, d); err != nil || dec.Source != client.SourceLocal {
			b.Fatal(dec, err)
		}
	}
}
