package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
)

// chargeRules allow every decision of the charge tests: each request carries a key of its own,
// charged one hit of ten a day, so each decision that ran in Redis leaves a key that outlives
// the test (a tenth of a day).
const chargeRules = `
domain: charge
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 10}
`

// chargeArgs run rls on Redis with one script call per decision (--redis-coalesce 0: no
// decisions merged into one call, so a script call run twice shows as one call more than
// decisions), nothing answered from the local cache, and UNAVAILABLE for a decision that
// failed, so that every OK comes from a script call that ran. A decision waits for Redis up
// to its caller's deadline (1 s) rather than 50 ms: decisions fail where connections are
// killed, not where a busy machine is slow.
func chargeArgs(t *testing.T, url string) []string {
	return []string{"--config", writeRules(t, map[string]string{"charge.yaml": chargeRules}), "--backend", "redis",
		"--redis-url", url, "--redis-key-prefix", "chg:", "--redis-coalesce", "0", "--redis-local-cache-size", "0",
		"--failure-mode", "error", "--redis-timeout", "1s"}
}

// chargeInterval is the time one hit of chargeRules's limit (ten a day) adds to its key's
// theoretical arrival time.
const chargeInterval = 24 * time.Hour / 10

// chargedKeys counts the keys of the Redis behind c that match pattern, and those charged more
// than once: each holds, first, its GCRA theoretical arrival time (a little-endian double, in
// microseconds of Redis's clock), one chargeInterval past the instant of its decision per hit.
func chargedKeys(t *testing.T, c *goredis.Client, pattern string) (keys, twice int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var names []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		names = append(names, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN %s on %s: %v", pattern, c.Options().Addr, err)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for start := 0; start < len(names); start += 1000 {
		pipe := c.Pipeline()
		var gets []*goredis.StringCmd
		for _, k := range names[start:min(start+1000, len(names))] {
			gets = append(gets, pipe.Get(ctx, k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("GET the keys %s on %s: %v", pattern, c.Options().Addr, err)
		}
		for _, g := range gets {
			v := []byte(g.Val())
			if len(v) < 8 {
				t.Fatalf("key %s holds %q, not a GCRA state", g.Args()[1], v)
			}
			tat := time.UnixMicro(int64(math.Float64frombits(binary.LittleEndian.Uint64(v))))
			// One hit: tat is one interval past its decision, less than an interval and the
			// test's length ahead; two: more than an interval ahead.
			if ahead := tat.Sub(now); ahead > chargeInterval+time.Minute {
				twice++
			}
		}
	}
	return int64(len(names)), twice
}

// loadCounts are what the callers of one load run saw.
type loadCounts struct {
	sent, ok, over, unavailable, late, other atomic.Int64
}

func (c *loadCounts) String() string {
	return fmt.Sprintf("%d sent: %d OK, %d OVER_LIMIT, %d UNAVAILABLE, %d DEADLINE_EXCEEDED, %d other",
		c.sent.Load(), c.ok.Load(), c.over.Load(), c.unavailable.Load(), c.late.Load(), c.other.Load())
}

// answered is the decisions Redis answered: OK or OVER_LIMIT, never the failure mode (error).
func (c *loadCounts) answered() int64 { return c.ok.Load() + c.over.Load() }

// runChargeLoad sends about rate requests a second to client from 10 callers until stop is
// closed, each request with one descriptor on a fresh key named tag-N and a 1 s deadline, and
// returns once every request has its answer.
func runChargeLoad(t *testing.T, client rlsv3.RateLimitServiceClient, tag string, rate int, stop <-chan struct{}) *loadCounts {
	t.Helper()
	const callers = 10
	var c loadCounts
	var seq atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			tick := time.NewTicker(time.Second * callers / time.Duration(rate))
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				key := tag + "-" + strconv.FormatInt(seq.Add(1), 10)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				c.sent.Add(1)
				resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "charge", Descriptors: oneDesc(d("k", key))})
				cancel()
				switch {
				case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					c.ok.Add(1)
				case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					c.over.Add(1)
				case status.Code(err) == codes.Unavailable:
					c.unavailable.Add(1)
				case status.Code(err) == codes.DeadlineExceeded:
					// A machine starved of CPU for a second (another test, another process):
					// the decision may have run or not, as under a killed connection.
					c.late.Add(1)
				default:
					if c.other.Add(1) <= 5 {
						t.Errorf("%s: %v %v", key, resp.GetOverallCode(), err)
					}
				}
			}
		})
	}
	wg.Wait()
	return &c
}

// adminName names the test's own connections to Redis, which killClients spares.
const adminName = "test-admin"

// redisAdmin is a client of the Redis at addr for the test itself, closed when the test ends.
func redisAdmin(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 6 * time.Second, ClientName: adminName})
	t.Cleanup(func() { c.Close() })
	return c
}

// nodeScriptRuns is how many script calls the Redis behind c has run (see redistest.ScriptRuns).
func nodeScriptRuns(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	runs, err := redistest.ScriptRuns(ctx, c)
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v", c.Options().Addr, err)
	}
	return runs
}

// keysMatching counts the keys of the Redis behind c that match pattern.
func keysMatching(t *testing.T, c *goredis.Client, pattern string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN %s on %s: %v", pattern, c.Options().Addr, err)
	}
	return n
}

// killClients kills, every 100 ms until stop is closed, the normal connections of the Redis
// that addr returns (as CLIENT KILL TYPE normal would) but Sentinel's own, whose loss every
// 100 ms would have it see the master down, and the test's, and returns how many it killed. Errors (the Redis
// is down, being replaced) are ignored: the killing goes on at the next tick.
func killClients(addr func() string, stop <-chan struct{}) (killed *atomic.Int64, done <-chan struct{}) {
	killed = new(atomic.Int64)
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		clients := map[string]*goredis.Client{}
		defer func() {
			for _, c := range clients {
				c.Close()
			}
		}()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			a := addr()
			c := clients[a]
			if c == nil {
				c = goredis.NewClient(&goredis.Options{Addr: a, DialTimeout: 200 * time.Millisecond,
					ReadTimeout: 500 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
				clients[a] = c
			}
			killed.Add(killNormalClients(c))
		}
	}()
	return killed, ch
}

// killNormalClients kills the normal connections of the Redis behind c but its own, the
// test's (named adminName) and Sentinel's (named sentinel-...), and returns how many it killed.
func killNormalClients(c *goredis.Client) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	list, err := c.Do(ctx, "client", "list", "type", "normal").Text()
	if err != nil {
		return 0
	}
	self, err := c.ClientID(ctx).Result()
	if err != nil {
		return 0
	}
	pipe := c.Pipeline()
	for _, line := range strings.Split(list, "\n") {
		var id int64
		var name string
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				id, _ = strconv.ParseInt(v, 10, 64)
			case "name":
				name = v
			}
		}
		if id != 0 && id != self && name != adminName && !strings.HasPrefix(name, "sentinel-") {
			pipe.Do(ctx, "client", "kill", "id", id)
		}
	}
	cmds, _ := pipe.Exec(ctx)
	var n int64
	for _, cmd := range cmds {
		if v, err := cmd.(*goredis.Cmd).Int64(); err == nil {
			n += v
		}
	}
	return n
}

// TestChargedOnce: with rls's connections to Redis killed under load (its normal connections
// but Sentinel's killed on the master every 100 ms, about 1,000 decisions a second), no
// decision is charged twice.
// Redis runs at most one script call per decision asked and at least one per decision it
// answered; on a single node, where every decision's key is its own and survives, exactly one
// per key it holds. Without kills (the control), calls, decisions and keys are equal. Through
// Sentinel the same holds across a failover (the master stalls, its replica catches up, the
// master dies and Sentinel promotes the replica): counted on every node that served, the dead
// master up to its death, and the promoted master holds one key per script call run.
func TestChargedOnce(t *testing.T) {
	const rate = 1000
	// phase runs the load for d on client, killing the connections of the Redis at addr when
	// kill, and returns what the callers saw, the script calls Redis ran, the keys it holds
	// and those charged twice.
	phase := func(t *testing.T, client rlsv3.RateLimitServiceClient, addr, tag string, kill bool, d time.Duration) (c *loadCounts, runs, keys, twice, killed int64) {
		t.Helper()
		admin := redisAdmin(t, addr)
		before := nodeScriptRuns(t, admin)
		stop := make(chan struct{})
		var kills *atomic.Int64
		killDone := make(<-chan struct{})
		if kill {
			kills, killDone = killClients(func() string { return addr }, stop)
		}
		time.AfterFunc(d, func() { close(stop) })
		c = runChargeLoad(t, client, tag, rate, stop)
		if kill {
			<-killDone
			killed = kills.Load()
		}
		// A call abandoned by its caller is never sent late; one in flight is answered within
		// the read timeout at most, far less on a killed connection.
		time.Sleep(500 * time.Millisecond)
		runs = nodeScriptRuns(t, admin) - before
		keys, twice = chargedKeys(t, admin, "*"+tag+"-*")
		return c, runs, keys, twice, killed
	}

	t.Run("single", func(t *testing.T) {
		r := redistest.Start(t)
		client := startRLS(t, nil, chargeArgs(t, r.URL())...).client(t)

		c, runs, keys, twice, _ := phase(t, client, r.Addr(), "ctl", false, 2*time.Second)
		t.Logf("control: %v; Redis ran %d script calls, holds %d keys, %d charged twice", c, runs, keys, twice)
		if c.sent.Load() < 200 {
			t.Fatalf("control: only %d requests sent", c.sent.Load())
		}
		if c.ok.Load() != c.sent.Load() || runs != c.sent.Load() || keys != c.sent.Load() || twice != 0 {
			t.Errorf("control: %v, %d script calls, %d keys (%d charged twice): want all equal, none twice", c, runs, keys, twice)
		}

		c, runs, keys, twice, killed := phase(t, client, r.Addr(), "kill", true, 4*time.Second)
		t.Logf("kills: %v; %d connections killed; Redis ran %d script calls, holds %d keys, %d charged twice", c, killed, runs, keys, twice)
		if killed < 10 {
			t.Errorf("only %d connections killed: the test did not disturb rls", killed)
		}
		if c.sent.Load() < 1000 {
			t.Fatalf("kills: only %d requests sent", c.sent.Load())
		}
		if runs > c.sent.Load() {
			t.Errorf("Redis ran %d script calls for %d decisions asked: %d charged twice", runs, c.sent.Load(), runs-c.sent.Load())
		}
		if runs < c.answered() {
			t.Errorf("Redis ran %d script calls but answered %d decisions", runs, c.answered())
		}
		if runs != keys {
			t.Errorf("Redis ran %d script calls but holds %d keys, one per decision that ran: %d calls ran again", runs, keys, runs-keys)
		}
		if twice != 0 {
			t.Errorf("%d of %d keys were charged twice", twice, keys)
		}
	})

	// With decisions coalesced (the default), many go in one merged script call: counting
	// calls tells nothing, but each key holds how often it was charged.
	t.Run("single coalesced", func(t *testing.T) {
		r := redistest.Start(t)
		args := chargeArgs(t, r.URL())
		for i, a := range args {
			if a == "--redis-coalesce" {
				args = append(args[:i], args[i+2:]...)
				break
			}
		}
		client := startRLS(t, nil, args...).client(t)
		c, runs, keys, twice, killed := phase(t, client, r.Addr(), "co", true, 3*time.Second)
		t.Logf("kills: %v; %d connections killed; Redis ran %d script calls, holds %d keys, %d charged twice", c, killed, runs, keys, twice)
		if killed < 10 {
			t.Errorf("only %d connections killed: the test did not disturb rls", killed)
		}
		if c.sent.Load() < 1000 {
			t.Fatalf("kills: only %d requests sent", c.sent.Load())
		}
		if keys > c.sent.Load() || keys < c.answered() {
			t.Errorf("Redis holds %d keys, one per decision that ran, for %d decisions asked and %d answered", keys, c.sent.Load(), c.answered())
		}
		if twice != 0 {
			t.Errorf("%d of %d keys were charged twice", twice, keys)
		}
	})

	t.Run("sentinel", func(t *testing.T) {
		s := redistest.StartSentinel(t)
		master, replica := s.Master, s.Replica
		admins := map[string]*goredis.Client{master.Addr(): redisAdmin(t, master.Addr()), replica.Addr(): redisAdmin(t, replica.Addr())}
		before := map[string]int64{}
		for a, c := range admins {
			before[a] = nodeScriptRuns(t, c)
		}
		p := startRLS(t, nil, chargeArgs(t, s.URL())...)
		client := p.client(t)

		var current atomic.Value
		current.Store(s.MasterAddr())
		stop := make(chan struct{})
		kills, killDone := killClients(func() string { return current.Load().(string) }, stop)
		var c *loadCounts
		loadDone := make(chan struct{})
		go func() { defer close(loadDone); c = runChargeLoad(t, client, "snt", rate, stop) }()
		stopLoad := sync.OnceFunc(func() { close(stop); <-loadDone; <-killDone })
		t.Cleanup(stopLoad) // when the test fails before it stops them

		time.Sleep(2 * time.Second)
		// The master stalls (CLIENT PAUSE: calls wait unrun), its count is taken, and it dies
		// with the calls it holds unrun.
		old := current.Load().(string)
		ctx := ctxT(t)
		if err := admins[old].Do(ctx, "client", "pause", "30000", "write").Err(); err != nil {
			t.Fatalf("CLIENT PAUSE on the master %s: %v", old, err)
		}
		final := map[string]int64{old: nodeScriptRuns(t, admins[old])}
		// What the master wrote has reached the replica: every key of a decision that ran
		// survives the failover.
		if n, err := admins[old].Do(ctx, "wait", "1", "5000").Int(); err != nil || n != 1 {
			t.Fatalf("WAIT 1 on the master %s: %v %v, want its replica to acknowledge", old, n, err)
		}
		s.ServerAt(old).Kill()
		killedAt := time.Now()
		promoted := s.WaitFailover(old, 20*time.Second)
		current.Store(promoted)
		t.Logf("master %s killed; Sentinel promoted %s after %v", old, promoted, time.Since(killedAt).Round(time.Millisecond))
		// Decisions after the failover: rls follows the new master.
		time.Sleep(2500 * time.Millisecond)
		stopLoad()
		time.Sleep(500 * time.Millisecond)
		final[promoted] = nodeScriptRuns(t, admins[promoted])
		var runs int64
		for a, n := range final {
			runs += n - before[a]
			t.Logf("%s ran %d script calls", a, n-before[a])
		}
		t.Logf("%v; %d connections killed; Redis ran %d script calls", c, kills.Load(), runs)
		if t.Failed() {
			t.Logf("Sentinel's log:\n%s", s.Log())
		}
		if kills.Load() < 10 {
			t.Errorf("only %d connections killed: the test did not disturb rls", kills.Load())
		}
		if c.sent.Load() < 1500 {
			t.Fatalf("only %d requests sent", c.sent.Load())
		}
		if n := final[promoted] - before[promoted]; n < 200 {
			t.Errorf("the promoted master ran %d script calls in 2.5 s of load: rls did not follow the failover", n)
		}
		if runs > c.sent.Load() {
			t.Errorf("Redis ran %d script calls for %d decisions asked: %d charged twice", runs, c.sent.Load(), runs-c.sent.Load())
		}
		if runs < c.answered() {
			t.Errorf("Redis ran %d script calls but answered %d decisions", runs, c.answered())
		}
		keys, twice := chargedKeys(t, admins[promoted], "*snt-*")
		t.Logf("the promoted master holds %d keys, %d charged twice", keys, twice)
		if keys != runs {
			t.Errorf("Redis ran %d script calls but the promoted master holds %d keys, one per decision that ran: %d calls ran again", runs, keys, runs-keys)
		}
		if twice != 0 {
			t.Errorf("%d of %d keys were charged twice", twice, keys)
		}
	})
}
