package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/redistest"
)

// TestNoScript: after SCRIPT FLUSH and FUNCTION FLUSH every call still works, direct and
// pipelined, and the count carries on; the library of Redis Functions is loaded again and calls
// go by it once more.
func TestNoScript(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"single coalesced", singleEnv, Options{Coalesce: 8}},
		{"single EVALSHA", singleEnv, Options{Coalesce: 8, evalOnly: true}},
		{"cluster", clusterEnv, Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.env, tc.opts)
			ctx := context.Background()
			if b.lib.fcall.Load() == tc.opts.evalOnly {
				t.Fatalf("calls by FCALL: %v, want %v (Redis 7 takes the library)", b.lib.fcall.Load(), !tc.opts.evalOnly)
			}
			flush := func() {
				each := func(ctx context.Context, n goredis.Cmdable) error {
					if err := n.ScriptFlush(ctx).Err(); err != nil {
						return err
					}
					return n.FunctionFlush(ctx).Err()
				}
				if c, ok := b.rdb.(*goredis.ClusterClient); ok {
					if err := c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return each(ctx, n) }); err != nil {
						t.Fatal(err)
					}
					return
				}
				if err := each(ctx, b.rdb); err != nil {
					t.Fatal(err)
				}
			}
			l := limit.Limit{Rate: 10, Period: time.Hour, Burst: 10}
			reqs := []backend.Request{{Key: "ns-a", Limit: l, Cost: 1}, {Key: "ns-b", Limit: l, Cost: 1}, {Key: "ns-c", Limit: l, Cost: 1}}
			decide := func(i int, after string) {
				t.Helper()
				out := make([]backend.Decision, len(reqs))
				ok, err := b.Decide(ctx, reqs, out)
				if err != nil {
					t.Fatalf("call %d %s: %v", i, after, err)
				}
				if !ok || out[0].Remaining != int64(9-i) {
					t.Fatalf("call %d %s: admitted=%v %+v, want admitted with remaining %d", i, after, ok, out, 9-i)
				}
			}
			for i := range 4 {
				flush()
				decide(i, "after SCRIPT FLUSH and FUNCTION FLUSH")
			}
			if tc.opts.evalOnly {
				if b.lib.fcall.Load() {
					t.Fatal("calls by FCALL with evalOnly")
				}
				return
			}
			deadline := time.Now().Add(5 * time.Second)
			for !b.lib.fcall.Load() {
				if time.Now().After(deadline) {
					t.Fatal("the library was not loaded again within 5s")
				}
				time.Sleep(time.Millisecond)
			}
			decide(4, "once the library is back")
		})
	}
}

// TestLibraryRefused: a Redis that refuses FUNCTION (here an ACL) leaves the backend on
// EVALSHA, and decisions go on as before.
func TestLibraryRefused(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "setuser", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	b := newURLBackend(t, "redis://nofn:pw@"+r.Addr())
	if !b.Healthy() || b.lib.fcall.Load() {
		t.Fatalf("healthy %v, calls by FCALL %v: want healthy, by EVALSHA", b.Healthy(), b.lib.fcall.Load())
	}
	l := limit.Limit{Rate: 2, Period: time.Hour, Burst: 2}
	for i, want := range []bool{true, true, false} {
		ok, err := b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		if err != nil || ok != want {
			t.Fatalf("call %d: admitted=%v err=%v, want admitted=%v", i, ok, err, want)
		}
	}
	if n, err := admin.FunctionList(ctx, goredis.FunctionListQuery{}).Result(); err != nil || len(n) != 0 {
		t.Fatalf("libraries %v (err %v), want none", n, err)
	}
}

// newURLBackend connects to the Redis at url with default options, closed when the test ends.
func newURLBackend(t *testing.T, url string) *Backend {
	t.Helper()
	target, err := ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestFCallRefused: a Redis that takes the library but refuses FCALL (renamed, as a proxy or a
// failover to an older Redis would; or an ACL without it) answers every decision all the same,
// through EVAL and then EVALSHA, and the backend stops sending FCALL for good.
func TestFCallRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		acl  []any // a user to connect as
	}{
		{"unknown command", []string{"--rename-command", "FCALL", "fcall-renamed"}, nil},
		{"ACL", nil, []any{"acl", "setuser", "nofcall", "on", ">pw", "~*", "&*", "+@all", "-fcall"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.StartWith(t, tc.args...)
			url := r.URL()
			if tc.acl != nil {
				admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
				defer admin.Close()
				if err := admin.Do(context.Background(), tc.acl...).Err(); err != nil {
					t.Fatal(err)
				}
				url = "redis://nofcall:pw@" + r.Addr()
			}
			target, err := ParseURL(url)
			if err != nil {
				t.Fatal(err)
			}
			for _, coalesce := range []int{0, 8} {
				b, err := New(context.Background(), Options{Target: target, Coalesce: coalesce, KeyPrefix: fmt.Sprintf("c%d:", coalesce)})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				if !b.lib.fcall.Load() {
					t.Fatal("the library was not loaded")
				}
				l := limit.Limit{Rate: 2, Period: time.Hour, Burst: 2}
				for i, want := range []bool{true, true, false} {
					ok, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l, Cost: 1}}, make([]backend.Decision, 1))
					if err != nil || ok != want {
						t.Fatalf("coalesce %d, call %d: admitted=%v err=%v, want admitted=%v", coalesce, i, ok, err, want)
					}
				}
				if b.lib.fcall.Load() || !b.lib.libraryRefused.Load() || !b.Healthy() {
					t.Fatalf("coalesce %d: calls by FCALL %v, library refused %v, healthy %v: want EVALSHA for good, healthy",
						coalesce, b.lib.fcall.Load(), b.lib.libraryRefused.Load(), b.Healthy())
				}
			}
		})
	}
}

// TestLibraryLater: a Redis that cannot take the library when rls starts (out of memory here:
// FUNCTION LOAD is a write, SCRIPT LOAD is not) gets it once it can: decisions go by EVALSHA
// meanwhile, then by FCALL.
func TestLibraryLater(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	b := newURLBackend(t, r.URL())
	if !b.Healthy() || b.lib.fcall.Load() || b.lib.libraryRefused.Load() {
		t.Fatalf("healthy %v, calls by FCALL %v, library refused %v: want healthy, EVALSHA, not refused for good",
			b.Healthy(), b.lib.fcall.Load(), b.lib.libraryRefused.Load())
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	l := limit.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; !b.lib.fcall.Load(); i++ {
		if time.Now().After(deadline) {
			t.Fatal("the library was not loaded within 5s of Redis taking writes again")
		}
		if ok, err := b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, make([]backend.Decision, 1)); err != nil || !ok {
			t.Fatalf("call %d: admitted=%v err=%v", i, ok, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, err := admin.FunctionList(ctx, goredis.FunctionListQuery{}).Result(); err != nil || len(n) != 1 || n[0].Name != functionName {
		t.Fatalf("libraries %v (err %v), want %s", n, err, functionName)
	}
}
