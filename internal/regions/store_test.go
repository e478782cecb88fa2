package regions

import (
	"context"
	"fmt"
	"testing"
	"time"

	redisbackend "github.com/rls-project/rls/internal/backend/redis"
	"github.com/rls-project/rls/internal/redistest"
)

// TestTableScripts: a region's table as the scripts keep it, on a real Redis (single node and
// Cluster: its keys share a slot). A publication is fenced by the agent's role; a share of
// nothing leaves the table but the log names it; a replica gets what changed since its
// publication, and the whole table when it is behind the log's floor.
func TestTableScripts(t *testing.T) {
	for _, env := range []string{redistest.SingleEnv, redistest.ClusterEnv} {
		t.Run(env, func(t *testing.T) {
			target, err := redisbackend.ParseURL(redistest.URL(t, env))
			if err != nil {
				t.Fatal(err)
			}
			rdb := redisbackend.NewClient(target, time.Second, time.Second)
			defer rdb.Close()
			ctx := context.Background()
			k := newKeys(fmt.Sprintf("table-test-%d:", time.Now().UnixNano()))
			table := []string{k.table, k.changes, k.meta}
			publish := func(token string, entries ...string) int64 {
				t.Helper()
				args := []any{token, int64(1 << 50)}
				for _, e := range entries {
					args = append(args, e)
				}
				seq, err := publishScript.Run(ctx, rdb, append([]string{k.agent}, table...), args...).Int64()
				if err != nil {
					t.Fatal(err)
				}
				return seq
			}
			fetch := func(since int64) (whole bool, got map[string]string) {
				t.Helper()
				res, err := fetchScript.Run(ctx, rdb, table, since).Slice()
				if err != nil {
					t.Fatal(err)
				}
				got = map[string]string{}
				for i := 5; i+1 < len(res); i += 2 {
					got[res[i].(string)] = res[i+1].(string)
				}
				return res[4].(string) == "1", got
			}
			if err := rdb.Set(ctx, k.agent, "me", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if seq := publish("other", "a", "1 5 2"); seq != -1 {
				t.Fatalf("a publication by a replica without the role: %d, want -1", seq)
			}
			s1 := publish("me", "a", "1 5 2", "b", "2 3 1")
			if whole, got := fetch(0); !whole || len(got) != 2 || got["a"] != "1 5 2" {
				t.Fatalf("first fetch: whole %v %v", whole, got)
			}
			s2 := publish("me", "b", "3 0 0", "c", "4 7 3")
			if whole, got := fetch(s1); whole || len(got) != 2 || got["b"] != "0 0 0" || got["c"] != "4 7 3" {
				t.Fatalf("since %d: whole %v %v, want b gone (0 0 0) and c", s1, whole, got)
			}
			if n, _ := rdb.HLen(ctx, k.table).Result(); n != 2 {
				t.Fatalf("table holds %d keys, want 2 (b's share of nothing removed)", n)
			}
			if err := rdb.HSet(ctx, k.meta, "floor", s2).Err(); err != nil {
				t.Fatal(err)
			}
			if whole, got := fetch(s1); !whole || len(got) != 2 || got["a"] != "1 5 2" || got["c"] != "4 7 3" {
				t.Fatalf("behind the floor: whole %v %v, want the whole table", whole, got)
			}
		})
	}
}
