package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
)

const slotRules = `
domain: test
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
    concurrency: {max_in_flight: 2, slot_lifetime: 1m}
`

// TestAcquire: against the real rls, Acquire holds a slot until its release, a third request
// in flight is denied, a release frees its slot once however often it is called.
func TestAcquire(t *testing.T) {
	t.Parallel()
	p := rlstest.Start(t, rlstest.Options{Rules: slotRules})
	c := newClient(t, p.GRPCAddr, client.Options{Timeout: 5 * time.Second})
	ctx := ctxT(t)
	user := client.Desc("user", "alice")
	d1, release1, err := c.Acquire(ctx, user)
	if err != nil || !d1.Allowed || d1.Remaining != 1 {
		t.Fatalf("first: %+v %v", d1, err)
	}
	d2, release2, err := c.Acquire(ctx, user)
	if err != nil || !d2.Allowed {
		t.Fatalf("second: %+v %v", d2, err)
	}
	d3, release3, err := c.Acquire(ctx, user)
	if err != nil || d3.Allowed || d3.Descriptor.String() != "user=alice" {
		t.Fatalf("third in flight: %+v %v, want denied naming user=alice", d3, err)
	}
	release3() // denied: holds nothing
	release1()
	release1()
	d4, release4, err := c.Acquire(ctx, user)
	if err != nil || !d4.Allowed {
		t.Fatalf("after a release: %+v %v", d4, err)
	}
	if d, _, _ := c.Acquire(ctx, user); d.Allowed {
		t.Fatal("the second call of release1 freed a slot")
	}
	release2()
	release4()
	if d, rel, err := c.Acquire(ctx, user); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after every release: %+v %v", d, err)
	} else {
		rel()
	}
	if _, _, err := c.Acquire(context.Background(), client.Descriptor{}); err == nil {
		t.Fatal("an empty descriptor acquired")
	}
}
