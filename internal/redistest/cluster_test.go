package redistest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCluster: StartCluster starts 3 masters with a replica each, all in sync; Owners names the
// master that takes each key (its SET succeeds there and is redirected elsewhere); after SIGKILL
// of one master and SIGSTOP of another, WaitPromoted names the failed master's replica, and the
// stopped master, resumed, rejoins as a replica.
func TestCluster(t *testing.T) {
	start := time.Now()
	c := StartCluster(t, ClusterOptions{})
	t.Logf("3 masters and 3 replicas in sync in %v", time.Since(start).Round(time.Millisecond))
	nodes := c.Nodes()
	replicaOf := map[string]string{}
	var masters []string
	for _, n := range nodes {
		switch n.Role {
		case "master":
			masters = append(masters, n.Addr)
		case "replica":
			replicaOf[n.Master] = n.Addr
		default:
			t.Fatalf("node %s: role %q", n.Addr, n.Role)
		}
		if n.Pid == 0 {
			t.Fatalf("node %s: no pid", n.Addr)
		}
	}
	if len(masters) != 3 || len(replicaOf) != 3 {
		t.Fatalf("%d masters and replicas of %d masters, want 3 and 3: %+v", len(masters), len(replicaOf), nodes)
	}
	slices.Sort(masters)
	if got := c.Masters(); !slices.Equal(got, masters) {
		t.Fatalf("Masters() = %v, want %v", got, masters)
	}
	if u := c.URL(); !strings.HasPrefix(u, "redis-cluster://") || strings.Count(u, ",") != 2 {
		t.Fatalf("URL() = %q", u)
	}

	var keys []string
	for i := range 60 {
		keys = append(keys, fmt.Sprintf("key-%d", i))
	}
	groups := c.GroupByMaster(keys)
	if len(groups) != 3 {
		t.Fatalf("60 keys on %d masters, want 3", len(groups))
	}
	ctx := context.Background()
	for owner, ks := range groups {
		for _, k := range ks {
			if err := c.Client(owner).Set(ctx, k, "v", 0).Err(); err != nil {
				t.Fatalf("SET %s on its owner %s: %v", k, owner, err)
			}
			for _, m := range masters {
				if m == owner {
					continue
				}
				if err := c.Client(m).Set(ctx, k, "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
					t.Fatalf("SET %s on %s, not its owner: %v, want MOVED", k, m, err)
				}
			}
		}
	}

	killed, stopped := masters[0], masters[1]
	c.Kill(killed)
	start = time.Now()
	got, at := c.WaitPromoted(t, killed, 30*time.Second)
	if got != replicaOf[killed] {
		t.Fatalf("%s's slots went to %s, want its replica %s", killed, got, replicaOf[killed])
	}
	t.Logf("SIGKILL of %s: %s promoted %v later", killed, got, at.Sub(start).Round(time.Millisecond))
	if o := c.MasterFor(groups[killed][0]); o != got {
		t.Fatalf("MasterFor a key of the killed master: %s, want %s", o, got)
	}
	if err := c.Client(got).Get(ctx, groups[killed][0]).Err(); err != nil {
		t.Fatalf("GET on the promoted replica: %v (the replica had the key)", err)
	}

	c.Stop(stopped)
	start = time.Now()
	got, at = c.WaitPromoted(t, stopped, 30*time.Second)
	if got != replicaOf[stopped] {
		t.Fatalf("%s's slots went to %s, want its replica %s", stopped, got, replicaOf[stopped])
	}
	t.Logf("SIGSTOP of %s: %s promoted %v later", stopped, got, at.Sub(start).Round(time.Millisecond))
	c.Cont(stopped)
	c.WaitHealthy(t, 30*time.Second)
	for _, n := range c.Nodes() {
		if n.Addr == stopped && (n.Role != "replica" || n.Master != got) {
			t.Fatalf("the resumed master %s: %s of %q, want a replica of %s", stopped, n.Role, n.Master, got)
		}
	}
}
