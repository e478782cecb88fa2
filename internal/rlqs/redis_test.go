package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/redistest"
)

// TestLeaveScriptMatchesGo: leaveScript, run on a real Redis, leaves a proxy's field as Go
// would write it with its seen-until 0, for random states at the extremes encodeProxy writes;
// leaves other proxies' fields and fields of another form as they are; and a missing bucket or
// proxy missing.
func TestLeaveScriptMatchesGo(t *testing.T) {
	opt, err := goredis.ParseURL(redistest.URL(t, redistest.SingleEnv))
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	r := NewRedis(rdb, fmt.Sprintf("rlqs-leave-%d:", time.Now().UnixNano()))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...int64) int64 { return xs[rng.IntN(len(xs))] }
	for i := range 300 {
		p := proxyState{
			Demand:    []float64{0, 0.001, 1.5, 1e-300, 1e300, rng.Float64() * 1e6}[rng.IntN(6)],
			SeenUntil: pick(1, 1<<62, rng.Int64(), time.Now().UnixMilli()),
			Held:      Share{Rate: pick(0, 1, 1<<62, rng.Int64N(1e9)), Burst: pick(0, 1, 1<<62, rng.Int64N(1e9))},
			HoldUntil: pick(0, -1, 1<<62, rng.Int64()),
		}
		bucket, proxy := fmt.Sprintf("b%d", i), fmt.Sprintf("proxy-%d", i)
		key := r.key(bucket)
		other := encodeProxy(&proxyState{Demand: 3, SeenUntil: 7, HoldUntil: 9})
		if err := rdb.HSet(ctx, key, proxy, encodeProxy(&p), "other", other, budgetField, "5 6").Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.Leave(ctx, bucket, proxy, 0); err != nil {
			t.Fatal(err)
		}
		want := p
		want.SeenUntil = 0
		got, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got[proxy] != encodeProxy(&want) || got["other"] != other || got[budgetField] != "5 6" || len(got) != 3 {
			t.Fatalf("state %+v (%q): after Leave %q, want %q beside the others unchanged", p, encodeProxy(&p), got, encodeProxy(&want))
		}
		if d, ok := decodeProxy(got[proxy]); !ok || d != want {
			t.Fatalf("state %+v: after Leave decodes as %+v (%v), want %+v", p, d, ok, want)
		}
	}

	for _, v := range []string{"", "1 2 3 4", "1 2 3 4 5 6", "junk"} {
		key := r.key("odd")
		if err := rdb.HSet(ctx, key, "p", v).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.Leave(ctx, "odd", "p", 0); err != nil {
			t.Fatal(err)
		}
		if got := rdb.HGet(ctx, key, "p").Val(); got != v {
			t.Errorf("field %q of another form: after Leave %q, want it unchanged", v, got)
		}
	}
	if err := r.Leave(ctx, "none", "p", 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Leave(ctx, "odd", "absent", 0); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, r.key("none")).Val(); n != 0 {
		t.Errorf("Leave on a missing bucket created it")
	}
	if rdb.HExists(ctx, r.key("odd"), "absent").Val() {
		t.Errorf("Leave of a missing proxy created its field")
	}
}
