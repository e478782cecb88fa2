package redistest

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestSentinelFailsOver: a key written through the Sentinel's master is on its replica; the
// master killed, the Sentinel promotes the replica, which holds the key and takes writes.
func TestSentinelFailsOver(t *testing.T) {
	s := StartSentinel(t)
	if got := s.MasterAddr(); got != s.Master.Addr() {
		t.Fatalf("the Sentinel reports master %s, want %s", got, s.Master.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{s.Addr()}})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %v %v, want the replica's acknowledgement", n, err)
	}
	old := s.Master.Addr()
	s.ServerAt(old).Kill()
	promoted := s.WaitFailover(old, 20*time.Second)
	if promoted != s.Replica.Addr() {
		t.Fatalf("promoted %s, want the replica %s", promoted, s.Replica.Addr())
	}
	r := goredis.NewClient(&goredis.Options{Addr: promoted})
	defer r.Close()
	if v, err := r.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k on the promoted replica: %q %v, want v", v, err)
	}
	if err := r.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Fatalf("SET on the promoted replica: %v", err)
	}
}
