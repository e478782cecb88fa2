package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
)

// The Cluster fault tests start their own Redis Cluster each (3 masters, a replica each,
// cluster-node-timeout 2000 ms): they kill, stop and fail over its nodes, so they never touch
// the Cluster in RLS_TEST_REDIS_CLUSTER_URL.

const clusterFaultRules = `
domain: cf
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: tight
    rate_limit: {unit: second, requests_per_unit: 10, burst: 5}
  - key: probe
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: once
    rate_limit: {unit: day, requests_per_unit: 10}
`

const (
	cfPrefix      = "cf:"
	tightRate     = 10.0 // the tight rule's requests per second
	tightBurst    = 5
	cfUserKeys    = 200
	cfRate        = 1000        // requests a second over the user keys
	cfChargedRate = 1000        // requests a second in TestClusterChargedOnce
	cfQuietRate   = 30          // requests a second over the user keys to the third replica
	cfDeadline    = time.Second // each caller's deadline
	cfHandful     = 5           // failures allowed per replica on keys of healthy masters
	cfPromotedOK  = time.Second // the failed master's keys are answered within this of its replica's promotion
)

// cfConns is how many connections the load spreads its calls to a replica over, as Envoy
// opens one per worker thread. Over one, on a machine short of CPU, the connection's one
// reading goroutine in rls (gRPC's) fell behind the calls' frames while decisions waited for
// their messages, whatever the backend did.
const cfConns = 4

// cfStoredKey is the Redis key under which rls keeps the state of the first limit of the
// one-entry descriptor key=value of domain: the service's key (each field length-prefixed, then
// '#' and the limit's index) under the key prefix. Only short keys without '{' are stored as
// they are; the probe in startClusterFault checks this against where rls's key really is.
func cfStoredKey(domain, key, value string) string {
	k := fmt.Sprintf("%d:%s%d:%s%d:%s#0", len(domain), domain, len(key), key, len(value), value)
	if len(k) > 200 || strings.ContainsAny(k, "{") || strings.HasPrefix(k, "sha256:") {
		panic("cfStoredKey: " + k + " is not stored as it is")
	}
	return cfPrefix + k
}

// clusterFault is one fault test's Cluster, rls replicas and keys.
type clusterFault struct {
	c       *redistest.Cluster
	procs   []*rlsProc
	clients []rlsv3.RateLimitServiceClient
	conns   [][]rlsv3.RateLimitServiceClient // per replica, the load's connections (cfConns)
	diag    *stallDiag
	masters []string            // at start, sorted
	keys    map[string][]string // user values by the master serving them at start
	owner   map[string]string   // user value → its master at start
	tight   string              // the tight key's value, on masters[0]
}

// startClusterFault starts a Cluster and three rls replicas on it with default flags and extra
// (two under load, one under a light load: cfQuietRate), checks that cfStoredKey names rls's
// keys, and sorts cfUserKeys user values and a tight value by master.
func startClusterFault(t *testing.T, opts redistest.ClusterOptions, extra ...string) *clusterFault {
	t.Helper()
	f := &clusterFault{c: redistest.StartCluster(t, opts)}
	f.masters = f.c.Masters()
	if len(f.masters) != 3 {
		t.Fatalf("masters %v, want 3", f.masters)
	}
	rules := writeRules(t, map[string]string{"cf.yaml": clusterFaultRules})
	for range 3 {
		args := append([]string{"--config", rules, "--backend", "redis",
			"--redis-url", f.c.URL(), "--redis-key-prefix", cfPrefix}, extra...)
		if stallDir != "" {
			args = append(args, "--debug")
		}
		f.procs = append(f.procs, launchRLS(t, nil, args...))
	}
	for _, p := range f.procs {
		p.WaitReady(t)
		f.clients = append(f.clients, p.client(t))
		conns := []rlsv3.RateLimitServiceClient{f.clients[len(f.clients)-1]}
		for len(conns) < cfConns {
			conns = append(conns, p.client(t))
		}
		f.conns = append(f.conns, conns)
	}

	// rls's key for probe=p is where cfStoredKey says: its day-long state is there, on the master
	// serving that key.
	ctx := ctxT(t)
	resp, err := f.clients[0].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cf", Descriptors: oneDesc(d("probe", "p"))})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the probe request: %v %v", resp.GetOverallCode(), err)
	}
	probe := cfStoredKey("cf", "probe", "p")
	if n, err := f.c.Client(f.c.MasterFor(probe)).Exists(ctx, probe).Result(); err != nil || n != 1 {
		t.Fatalf("rls's key for probe=p is not %q on its master %s (EXISTS: %d, %v): cfStoredKey no longer follows rls's keys",
			probe, f.c.MasterFor(probe), n, err)
	}

	var values, stored []string
	for i := range cfUserKeys {
		v := "u" + strconv.Itoa(i)
		values = append(values, v)
		stored = append(stored, cfStoredKey("cf", "user", v))
	}
	f.keys, f.owner = map[string][]string{}, map[string]string{}
	for i, m := range f.c.Owners(stored) {
		f.keys[m] = append(f.keys[m], values[i])
		f.owner[values[i]] = m
	}
	for i := 0; f.tight == ""; i++ {
		if v := "t" + strconv.Itoa(i); f.c.MasterFor(cfStoredKey("cf", "tight", v)) == f.masters[0] {
			f.tight = v
		}
	}
	for _, m := range f.masters {
		if len(f.keys[m]) < 30 {
			t.Fatalf("only %d of %d keys on %s", len(f.keys[m]), cfUserKeys, m)
		}
	}
	// Each replica decides a key of each master before the load: its connections are up.
	for i, c := range f.clients {
		for _, m := range f.masters {
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cf", Descriptors: oneDesc(d("user", f.keys[m][0]))})
				if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %d, a key of %s: %v %v", i, m, resp.GetOverallCode(), err)
				}
			}
		}
	}
	return f
}

// cfAnswer is one answered request.
type cfAnswer struct {
	replica    int
	value      string // the user or tight value
	tight      bool
	sent, recv time.Time
	code       codes.Code
	overall    rlsv3.RateLimitResponse_Code
	remaining  uint32
	msg        string // the error's message, for the log
}

// fromRedis reports whether the answer was decided (OK or OVER_LIMIT), not the failure mode's.
func (a cfAnswer) fromRedis() bool {
	return a.code == codes.OK && (a.overall == rlsv3.RateLimitResponse_OK || a.overall == rlsv3.RateLimitResponse_OVER_LIMIT)
}

// cfLoad sends, open loop, rate requests a second over the user values (or, with once, each
// on a key of its own, once=<n>) and tightRate*4 on the tight value, alternating replicas 0 and
// 1, and cfQuietRate over the user values to replica 2, each with a cfDeadline deadline, until
// stop is called; a replica's calls go over its cfConns connections in turn.
type cfLoad struct {
	mu      sync.Mutex
	answers []cfAnswer
	asked   atomic.Int64
	pacers  sync.WaitGroup
	sends   sync.WaitGroup
	done    chan struct{}
	start   time.Time
}

func (f *clusterFault) load(rate float64, tight, once bool) *cfLoad {
	l := &cfLoad{done: make(chan struct{}), start: time.Now()}
	var values []string
	for _, m := range f.masters {
		values = append(values, f.keys[m]...)
	}
	slices.Sort(values)
	var next atomic.Uint64
	send := func(replica int, key, value string) {
		isTight := key == "tight"
		ctx, cancel := context.WithTimeout(context.Background(), cfDeadline)
		defer cancel()
		a := cfAnswer{replica: replica, value: value, tight: isTight, sent: time.Now()}
		l.asked.Add(1)
		f.diag.begin(&a)
		conns := f.conns[replica]
		c := conns[next.Add(1)%uint64(len(conns))]
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cf", Descriptors: oneDesc(d(key, value))})
		a.recv, a.code, a.overall = time.Now(), status.Code(err), resp.GetOverallCode()
		f.diag.end(&a)
		if err != nil {
			a.msg = status.Convert(err).Message()
		}
		if len(resp.GetStatuses()) == 1 {
			a.remaining = resp.GetStatuses()[0].GetLimitRemaining()
		}
		l.mu.Lock()
		l.answers = append(l.answers, a)
		l.mu.Unlock()
	}
	pace := func(rate float64, next func(i int)) {
		sent := 0
		for {
			select {
			case <-l.done:
				return
			default:
			}
			due := int(time.Since(l.start).Seconds() * rate)
			for ; sent < due; sent++ {
				next(sent)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	l.pacers.Go(func() {
		pace(rate, func(i int) {
			if once {
				l.sends.Go(func() { send(i%2, "once", fmt.Sprintf("%d-%d", l.start.UnixNano(), i)) })
			} else {
				// Each key goes to either replica in turn, round after round.
				l.sends.Go(func() { send((i+i/len(values))%2, "user", values[i%len(values)]) })
			}
		})
	})
	if tight {
		l.pacers.Go(func() {
			pace(4*tightRate, func(i int) { l.sends.Go(func() { send(i%2, "tight", f.tight) }) })
		})
	}
	if !once {
		// A replica under light load learns of a failure from few decisions.
		l.pacers.Go(func() {
			pace(cfQuietRate, func(i int) { l.sends.Go(func() { send(2, "user", values[(i*7)%len(values)]) }) })
		})
	}
	return l
}

// stop stops the load and returns every answer, once each is in.
func (l *cfLoad) stop() []cfAnswer {
	close(l.done)
	l.pacers.Wait()
	l.sends.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers
}

// stateWatch polls cluster_state on addrs every 10 ms and keeps when any said it was not ok:
// while so, that node itself refuses every key (CLUSTERDOWN), whatever rls does.
type stateWatch struct {
	mu          sync.Mutex
	first, last time.Time
	polls, down int
	done        chan struct{}
	wg          sync.WaitGroup
}

func watchState(c *redistest.Cluster, addrs []string) *stateWatch {
	w := &stateWatch{done: make(chan struct{})}
	w.wg.Go(func() {
		for {
			select {
			case <-w.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, a := range addrs {
				before := time.Now()
				ok := c.ClusterStateOK(a, 500*time.Millisecond)
				w.mu.Lock()
				w.polls++
				if !ok {
					w.down++
					if w.first.IsZero() {
						w.first = before
					}
					w.last = time.Now()
				}
				w.mu.Unlock()
			}
		}
	})
	return w
}

func (w *stateWatch) stop() (first, last time.Time) {
	close(w.done)
	w.wg.Wait()
	return w.first, w.last
}

// TestClusterMasterFault: two rls replicas on a 3-master Cluster (a replica each, node timeout
// 2 s) under about 1,000 requests a second over 200 keys and a tight key (10/s, burst 5) of
// another master, a third replica under 30 a second over the same keys; one master, serving neither the tight key nor the most keys, is SIGKILLed, or
// SIGSTOPped until its replica took over (at least 4 s) and resumed; with
// cluster-require-full-coverage yes and no. Keys of the healthy masters see at most a handful
// of failures per replica (the failure mode's UNAVAILABLE, or no answer within the callers'
// 1 s), beyond those Redis itself refuses while cluster_state:fail (with full coverage, from
// the master being marked failed to its replica's promotion); the failed master's keys are
// answered again within a second of the promotion; the tight key never admits more than its
// limit allows. Each figure BENCHMARKS.md reports for these faults is logged.
func TestClusterMasterFault(t *testing.T) {
	for _, fault := range []string{"sigkill", "sigstop"} {
		for _, partial := range []bool{false, true} {
			name := fault + "/full-coverage"
			if partial {
				name = fault + "/partial-coverage"
			}
			t.Run(name, func(t *testing.T) { clusterMasterFault(t, fault, partial) })
		}
	}
}

func clusterMasterFault(t *testing.T, fault string, partial bool) {
	// A budget of 500 ms, not 50, for each decision: on a busy machine a healthy Redis or rls
	// itself now and then stalls for tens of ms, which would fail decisions on healthy keys.
	f := startClusterFault(t, redistest.ClusterOptions{PartialCoverage: partial}, "--redis-timeout", "500ms")
	// The failed master: not the tight key's, the one of the other two serving fewer keys.
	failed, healthy := f.masters[1], []string{f.masters[0], f.masters[2]}
	if len(f.keys[f.masters[2]]) < len(f.keys[failed]) {
		failed, healthy = f.masters[2], []string{f.masters[0], f.masters[1]}
	}
	watch := watchState(f.c, healthy)
	f.diag = newStallDiag(t.Name(), f.procs, func(a *cfAnswer) bool { return f.owner[a.value] == failed })
	l := f.load(cfRate, true, false)
	time.Sleep(800 * time.Millisecond)

	f.diag.traceAll(4)
	faultAt := time.Now()
	var contAt time.Time
	switch fault {
	case "sigkill":
		f.c.Kill(failed)
	case "sigstop":
		f.c.Stop(failed)
	}
	promoted, promotedAt := f.c.WaitPromoted(t, failed, 30*time.Second)
	end := promotedAt.Add(cfPromotedOK + 800*time.Millisecond)
	if fault == "sigstop" {
		if d := time.Until(faultAt.Add(4 * time.Second)); d > 0 {
			time.Sleep(d)
		}
		f.c.Cont(failed)
		contAt = time.Now()
		if e := contAt.Add(time.Second); e.After(end) {
			end = e
		}
	}
	time.Sleep(time.Until(end))
	answers := l.stop()
	downFirst, downLast := watch.stop()
	f.diag.finish(slices.Clone(answers), faultAt, f.owner, failed)
	for i, p := range f.procs {
		select {
		case <-p.Done():
			t.Fatalf("rls replica %d died: %v\n%s", i, p.ExitErr(), p.Output())
		default:
		}
	}

	ms := func(at time.Time) string {
		if at.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%+dms", at.Sub(faultAt).Milliseconds())
	}
	t.Logf("%s of master %s (%d of %d keys) at 0ms; its replica %s promoted at %s; cont at %s; end at %s; %d answers",
		fault, failed, len(f.keys[failed]), cfUserKeys, promoted, ms(promotedAt), ms(contAt), ms(end), len(answers))
	// Redis's own refusal: while a healthy master says cluster_state:fail it refuses every key.
	refusing := func(a cfAnswer) bool {
		return !downFirst.IsZero() && a.recv.After(downFirst.Add(-50*time.Millisecond)) && a.sent.Before(downLast.Add(300*time.Millisecond))
	}
	if downFirst.IsZero() {
		t.Logf("the healthy masters said cluster_state:ok throughout")
	} else {
		t.Logf("a healthy master said cluster_state:fail (Redis refusing every key) from %s to %s", ms(downFirst), ms(downLast))
	}

	type group struct {
		n, failures, refused int
		first, last          time.Time // first and last failure (received)
		firstOK              time.Time // first OK received after the promotion
		late                 int       // failures sent a second after the promotion or later
		why                  map[string]int
	}
	groups := map[string]*group{} // by "replica/failed|healthy|tight"
	var before, tightOK int
	var tightFirst, tightLast time.Time
	for _, a := range answers {
		// The first 300 ms of load are left out of this check: a process just started, on a busy
		// machine, may take that long to keep up.
		if a.recv.Before(faultAt) && !a.fromRedis() && a.sent.After(l.start.Add(300*time.Millisecond)) {
			before++
		}
		kind := "healthy"
		switch {
		case a.tight:
			kind = "tight"
			if a.code == codes.OK && a.overall == rlsv3.RateLimitResponse_OK {
				tightOK++
			}
			if tightFirst.IsZero() || a.sent.Before(tightFirst) {
				tightFirst = a.sent
			}
			if a.recv.After(tightLast) {
				tightLast = a.recv
			}
		case f.owner[a.value] == failed:
			kind = "failed"
		}
		if a.recv.Before(faultAt) {
			continue
		}
		key := fmt.Sprintf("replica %d, %s keys", a.replica, kind)
		g := groups[key]
		if g == nil {
			g = &group{why: map[string]int{}}
			groups[key] = g
		}
		g.n++
		if a.fromRedis() {
			if a.recv.After(promotedAt) && (g.firstOK.IsZero() || a.recv.Before(g.firstOK)) {
				g.firstOK = a.recv
			}
			continue
		}
		if kind != "failed" && refusing(a) {
			g.refused++
			continue
		}
		g.failures++
		g.why[a.code.String()+": "+a.msg]++
		if g.first.IsZero() || a.recv.Before(g.first) {
			g.first = a.recv
		}
		if a.recv.After(g.last) {
			g.last = a.recv
		}
		if !a.sent.Before(promotedAt.Add(cfPromotedOK)) {
			g.late++
		}
	}
	if before > 0 {
		t.Fatalf("%d failures received before the fault (from 300 ms into the load): the run is not sound (%s)", before, describeFailures(answers, l.start, faultAt, f))
	}
	var names []string
	for k := range groups {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		g := groups[k]
		switch {
		case strings.HasSuffix(k, "failed keys"):
			firstOK := "none"
			if !g.firstOK.IsZero() {
				firstOK = fmt.Sprintf("promotion%+dms", g.firstOK.Sub(promotedAt).Milliseconds())
			}
			t.Logf("%s: %d answers received after the fault, %d failures from %s to %s; first OK after the promotion: %s",
				k, g.n, g.failures, ms(g.first), ms(g.last), firstOK)
		default:
			t.Logf("%s: %d answers received after the fault, %d failures from %s to %s (and %d while Redis refused every key)",
				k, g.n, g.failures, ms(g.first), ms(g.last), g.refused)
		}
		switch {
		case strings.HasSuffix(k, "failed keys"):
			if g.late > 0 {
				t.Errorf("%s: %d failures to requests sent %v or more after the promotion, want 0; %s",
					k, g.late, cfPromotedOK, topReasons(g.why))
			}
			if g.firstOK.IsZero() {
				t.Errorf("%s: no OK answer after the promotion", k)
			}
		default:
			if g.failures > cfHandful {
				t.Errorf("%s: %d failures on keys of healthy masters (from %s to %s), want at most %d; %s",
					k, g.failures, ms(g.first), ms(g.last), cfHandful, topReasons(g.why))
			}
		}
	}
	allowed := tightBurst + tightRate*tightLast.Sub(tightFirst).Seconds() + 1
	t.Logf("tight key: %d admitted over %v where %.1f are allowed", tightOK, tightLast.Sub(tightFirst).Round(time.Millisecond), allowed)
	if float64(tightOK) > allowed {
		t.Errorf("tight key: %d admitted, more than the %.1f its limit allows", tightOK, allowed)
	}
}

// describeFailures tells the failures answered to requests sent before until: by code, by
// 100 ms after start, and what the replicas' metrics say of the backend.
func describeFailures(answers []cfAnswer, start, until time.Time, f *clusterFault) string {
	codes := map[string]int{}
	slots := map[int]int{}
	for _, a := range answers {
		if a.recv.Before(until) && !a.fromRedis() {
			codes[a.code.String()+"/"+a.overall.String()]++
			slots[int(a.sent.Sub(start)/(100*time.Millisecond))]++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "by code %v, by 100 ms since the load began %v", codes, slots)
	for i, p := range f.procs {
		fmt.Fprintf(&b, "; replica %d:", i)
		for _, line := range strings.Split(p.metrics(), "\n") {
			if strings.HasPrefix(line, "rls_backend") || strings.HasPrefix(line, "rls_overload") || strings.HasPrefix(line, "rls_redis") {
				fmt.Fprintf(&b, " %s", line)
			}
		}
	}
	return b.String()
}

// metrics returns the sample lines of the process's /metrics ("" when it does not answer).
func (p *rlsProc) metrics() string {
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// scriptRuns sums, from INFO commandstats of every running node of c, the script calls Redis
// ran (FCALL, EVALSHA, EVAL): calls less failed_calls, since a call refused as NOSCRIPT or
// "Function not found" counts in both and ran nothing. A redirected call (MOVED, CLUSTERDOWN)
// counts in rejected_calls only. Replicas count none: Redis 7 replicates a script's effects,
// not the script. It returns the sum and each node's share, for the log.
func scriptRuns(t *testing.T, c *redistest.Cluster) (int64, string) {
	t.Helper()
	ctx := ctxT(t)
	var total int64
	var each []string
	for _, n := range c.Nodes() {
		if n.Killed || n.Stopped {
			t.Fatalf("node %s is down: its script calls are lost", n.Addr)
		}
		runs, err := redistest.ScriptRuns(ctx, c.Client(n.Addr))
		if err != nil {
			t.Fatalf("INFO commandstats on %s: %v", n.Addr, err)
		}
		total += runs
		each = append(each, fmt.Sprintf("%s (%s) %d", n.Addr, n.Role, runs))
	}
	return total, strings.Join(each, ", ")
}

// TestClusterChargedOnce: two rls replicas with default flags on a 3-master Cluster (a replica
// each) under load, while every master's client connections are killed every 100 ms (CLIENT
// KILL TYPE normal) and one master is failed over to its replica (CLUSTER FAILOVER) midway.
// Each request holds one descriptor, which on a Cluster is one script call: Redis runs at most
// one script call per decision asked, and at least one per decision answered (OK or
// OVER_LIMIT). A call resent after its connection died, having run, is a decision charged
// twice; each request is on a key of its own (10 a day), so an answer with 8 remaining, not 9,
// is the reply of a second run of its call.
func TestClusterChargedOnce(t *testing.T) {
	f := startClusterFault(t, redistest.ClusterOptions{})
	ctx := ctxT(t)
	// A key of each master once, so that what rls loads (its library) is loaded; then counting
	// starts.
	for i, m := range f.masters {
		v := f.keys[m][0]
		if _, err := f.clients[i%2].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cf", Descriptors: oneDesc(d("user", v))}); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	resetStats := func() {
		t.Helper()
		for _, n := range f.c.Nodes() {
			if err := f.c.Client(n.Addr).ConfigResetStat(ctx).Err(); err != nil {
				t.Fatalf("CONFIG RESETSTAT on %s: %v", n.Addr, err)
			}
		}
	}
	resetStats()
	// The control: with nothing killed, one script call per decision, counted as scriptRuns does.
	control := f.load(cfChargedRate, false, true)
	time.Sleep(400 * time.Millisecond)
	var controlDecided int64
	for _, a := range control.stop() {
		if a.fromRedis() {
			controlDecided++
		}
	}
	time.Sleep(100 * time.Millisecond)
	controlRuns, controlEach := scriptRuns(t, f.c)
	t.Logf("control, nothing killed: %d decisions asked, %d answered from Redis; Redis ran %d script calls (%s)",
		control.asked.Load(), controlDecided, controlRuns, controlEach)
	if controlRuns > control.asked.Load() || controlRuns < controlDecided || controlDecided == 0 {
		t.Fatalf("control: %d script calls for %d decisions asked and %d answered: the count does not count decisions",
			controlRuns, control.asked.Load(), controlDecided)
	}
	resetStats()

	var masters atomic.Value
	masters.Store(f.masters)
	var kills, killRounds atomic.Int64
	stopKill := make(chan struct{})
	var killer sync.WaitGroup
	killer.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopKill:
				return
			case <-tick.C:
			}
			for _, m := range masters.Load().([]string) {
				kctx, cancel := context.WithTimeout(context.Background(), time.Second)
				// The admin connection may itself have been killed by a round on another node's
				// behalf; a failed round is simply one fewer.
				n, err := f.c.Client(m).Do(kctx, "CLIENT", "KILL", "TYPE", "normal").Int64()
				cancel()
				if err == nil {
					kills.Add(n)
				}
			}
			killRounds.Add(1)
		}
	})

	l := f.load(cfChargedRate, false, true)
	time.Sleep(1500 * time.Millisecond)
	since := func() time.Duration { return time.Since(l.start).Round(time.Millisecond) }
	// A manual failover: the replica takes over once it caught up, the master steps down.
	old := f.masters[1]
	var replica string
	for _, n := range f.c.Nodes() {
		if n.Role == "replica" && n.Master == old {
			replica = n.Addr
		}
	}
	if replica == "" {
		t.Fatalf("no replica of %s: %+v", old, f.c.Nodes())
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := f.c.Client(replica).Do(ctx, "CLUSTER", "FAILOVER").Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CLUSTER FAILOVER on %s: %v", replica, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	failoverAt := time.Now()
	t.Logf("CLUSTER FAILOVER sent %v into the load", since())
	promoted, at := f.c.WaitPromoted(t, old, 15*time.Second)
	t.Logf("promotion seen %v into the load", since())
	masters.Store([]string{f.masters[0], promoted, f.masters[2]})
	time.Sleep(3500 * time.Millisecond)
	answers := l.stop()
	t.Logf("load stopped %v into the load", since())
	close(stopKill)
	killer.Wait()
	time.Sleep(200 * time.Millisecond) // a call rls gave up on may still be running

	asked := l.asked.Load()
	var decided, failed, twice int64
	for _, a := range answers {
		if a.fromRedis() {
			decided++
			// Its key's first charge leaves 9 of 10: a reply of 8 is that of a second run.
			if a.remaining != 9 {
				twice++
				if twice <= 5 {
					t.Logf("once=%s answered %v with %d remaining of 10: charged %d times", a.value, a.overall, a.remaining, 10-a.remaining)
				}
			}
		} else {
			failed++
		}
	}
	runs, each := scriptRuns(t, f.c)
	t.Logf("CLUSTER FAILOVER of %s: %s serves its slots %v later", old, promoted, at.Sub(failoverAt).Round(time.Millisecond))
	t.Logf("%d connections killed in %d rounds of CLIENT KILL TYPE normal on every master", kills.Load(), killRounds.Load())
	t.Logf("%d decisions asked, %d answered from Redis (OK or OVER_LIMIT), %d by the failure mode; Redis ran %d script calls (%s)",
		asked, decided, failed, runs, each)
	if kills.Load() < 10 {
		t.Errorf("only %d connections killed: the test did not test", kills.Load())
	}
	if twice > 0 {
		t.Errorf("%d of %d decisions answered from Redis were charged more than once (each asked once, on a key of its own)", twice, decided)
	}
	if runs > asked {
		t.Errorf("Redis ran %d script calls for %d decisions asked: %d decisions charged twice", runs, asked, runs-asked)
	}
	if runs < decided {
		t.Errorf("Redis ran %d script calls, fewer than the %d decisions answered from Redis", runs, decided)
	}
}

// topReasons names the three commonest errors of why (error → count).
func topReasons(why map[string]int) string {
	var rs []string
	for r := range why {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b string) int { return why[b] - why[a] })
	var out []string
	for i, r := range rs {
		if i == 3 {
			break
		}
		out = append(out, fmt.Sprintf("%d× %q", why[r], r))
	}
	return "errors: " + strings.Join(out, ", ")
}
