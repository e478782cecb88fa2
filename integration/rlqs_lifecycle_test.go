package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/redistest"
)

// TestRLQSVanishedProxy: a proxy that vanishes keeps its share held for the assignment's TTL
// (it may enforce it that long), after which the proxy left gets the whole limit.
func TestRLQSVanishedProxy(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	const ttl = time.Second
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--rlqs-assignment-ttl", ttl.String(), "--rlqs-tick", "50ms")
	c := rlqsClient(t, p.GRPCAddr)
	bucket := map[string]string{"api_key": "shared"}
	report := func(s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, first bool) uint32 {
		m := &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket, 200, 200, 200*time.Millisecond)}}
		if first {
			m.Domain = "rlqs"
		}
		return exchange(t, s, m).GetTokenBucket().GetTokensPerFill().GetValue()
	}
	actx, cancelA := context.WithCancel(ctxT(t))
	a, err := c.StreamRateLimitQuotas(actx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := report(a, true); got != 969 { // the limit less the 1/32 never held
		t.Fatalf("a alone: %d, want 969", got)
	}
	report(b, true)
	// b's updates also arrive between reports; read them all as they come.
	var mu sync.Mutex
	var bRate uint32
	go func() {
		for {
			resp, err := b.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			bRate = resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue()
			mu.Unlock()
		}
	}()
	send := func(first bool) {
		m := &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket, 200, 200, 200*time.Millisecond)}}
		if err := b.Send(m); err != nil {
			t.Error(err)
		}
	}
	var lastA time.Time // before a's last report: what a holds is held until at least lastA + ttl
	for range 3 {
		lastA = time.Now()
		report(a, false)
		send(false)
		time.Sleep(100 * time.Millisecond)
	}
	cancelA()
	gone := time.Now()
	held := ttl - gone.Sub(lastA) - 5*time.Millisecond // less rls's clock's granularity
	var full time.Duration
	for full == 0 && time.Since(gone) < 5*time.Second {
		send(false)
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		if bRate >= 900 {
			full = time.Since(gone)
		}
		mu.Unlock()
	}
	if full == 0 || full < held || full > ttl+time.Second {
		t.Fatalf("b got the vanished proxy's share after %v, want after what a still held (%v) and within the TTL (%v) and a second", full, held, ttl)
	}
	t.Logf("the vanished proxy's share was reclaimed %v after it left (TTL %v)", full, ttl)
}

// metric reads one sample from rls's /metrics ("" labels: the first sample of the name).
func metric(t *testing.T, addr, name, labels string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+labels+" ") || (labels == "" && strings.HasPrefix(line, name+"{")) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s%s in /metrics", name, labels)
	return 0
}

// TestRLQSStreamsComeAndGo: 1,000 streams open, report, and end (half closing, half cut off);
// afterwards rls holds no more goroutines, streams or buckets than before, and its heap has not
// grown with them. The debug pages and metrics show the one stream left.
func TestRLQSStreamsComeAndGo(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--rlqs-assignment-ttl", "300ms", "--rlqs-testing-subsecond-ttl")
	c := rlqsClient(t, p.GRPCAddr)
	one := func(i int) error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, err := c.StreamRateLimitQuotas(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"api_key": fmt.Sprintf("key-%d", i)}, 3, 1, time.Second)}}); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
		if i%2 == 0 {
			s.CloseSend()
			for {
				if _, err := s.Recv(); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
			}
		}
		return nil // cancel cuts the stream off
	}
	run := func(n int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := one(i); err != nil {
					t.Errorf("stream %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
	}
	run(50) // warm up: connections, pools
	settle := func() (goroutines, heap float64) {
		// Past the TTL every held share has expired; the store looks for them once a second.
		time.Sleep(1300 * time.Millisecond)
		run(1) // a stream's decision sweeps what has expired
		deadline := time.Now().Add(5 * time.Second)
		for metric(t, p.HTTPAddr, "rls_rlqs_streams", "") != 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		return metric(t, p.HTTPAddr, "go_goroutines", ""), metric(t, p.HTTPAddr, "go_memstats_heap_inuse_bytes", "")
	}
	g0, h0 := settle()
	run(1000)
	g1, h1 := settle()
	if opened := metric(t, p.HTTPAddr, "rls_rlqs_streams_opened_total", ""); opened < 1052 {
		t.Errorf("%v streams opened, want ≥ 1052", opened)
	}
	if s := metric(t, p.HTTPAddr, "rls_rlqs_streams", ""); s != 0 {
		t.Errorf("%v streams still open", s)
	}
	if b := metric(t, p.HTTPAddr, "rls_rlqs_store_buckets", ""); b > 1 {
		t.Errorf("%v buckets still kept after their TTL", b)
	}
	if g1 > g0+5 {
		t.Errorf("goroutines %v after 1,000 streams, %v before", g1, g0)
	}
	if h1 > h0+8<<20 {
		t.Errorf("heap in use %v after 1,000 streams, %v before", h1, h0)
	}
	t.Logf("goroutines %v → %v, heap in use %.1f → %.1f MiB", g0, g1, h0/(1<<20), h1/(1<<20))

	// One stream that stays: listed by /debug/rlqs, explained, counted.
	s, err := c.StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	exchange(t, s, &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": "shared"}, 100, 50, time.Second)}})
	var list struct {
		Assignments []struct{ Bucket, Rule, Strategy string } `json:"assignments"`
	}
	getJSON(t, "http://"+p.DebugAddr+"/debug/rlqs", &list)
	if len(list.Assignments) != 1 || list.Assignments[0].Bucket != "api_key=shared" || list.Assignments[0].Strategy != "token_bucket" {
		t.Errorf("/debug/rlqs: %+v", list)
	}
	var ex struct {
		Rule    struct{ Path string } `json:"rule"`
		Proxies []struct {
			HeldRate int64 `json:"held_rate"`
		} `json:"proxies"`
	}
	getJSON(t, "http://"+p.DebugAddr+"/debug/rlqs/explain?domain=rlqs&bucket=api_key=shared", &ex)
	if ex.Rule.Path != "api_key=shared" || len(ex.Proxies) != 1 || ex.Proxies[0].HeldRate != 969 {
		t.Errorf("/debug/rlqs/explain: %+v", ex)
	}
	labels := `{domain="rlqs",rule="api_key=shared"}`
	if v := metric(t, p.HTTPAddr, "rls_rlqs_proxies", labels); v != 1 {
		t.Errorf("rls_rlqs_proxies %v, want 1", v)
	}
	if v := metric(t, p.HTTPAddr, "rls_rlqs_assigned_rate", labels); v != 969 { // the limit less the 1/32 never held
		t.Errorf("rls_rlqs_assigned_rate %v, want 969", v)
	}
	if v := metric(t, p.HTTPAddr, "rls_rlqs_demand_rate", labels); v != 150 {
		t.Errorf("rls_rlqs_demand_rate %v, want 150", v)
	}
	if v := metric(t, p.HTTPAddr, "rls_rlqs_requests_total", `{domain="rlqs",outcome="allowed",rule="api_key=shared"}`); v != 100 {
		t.Errorf("rls_rlqs_requests_total allowed %v, want 100", v)
	}
	// A domain no rule names is counted under _unknown_: proxies cannot add series by naming
	// domains.
	u, err := c.StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "no-such-domain-x7", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": "shared"}, 7, 0, time.Second)}}); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		body := metricsText(t, p.HTTPAddr)
		if strings.Contains(body, `rls_rlqs_requests_total{domain="_unknown_",outcome="allowed",rule="_none_"} 7`) {
			if strings.Contains(body, "no-such-domain-x7") {
				t.Errorf("a series names the unknown domain:\n%s", body)
			}
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no rls_rlqs_requests_total for the unknown domain under _unknown_:\n%s", body)
		}
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s\n%s", url, resp.Status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("%s: %v\n%s", url, err, body)
	}
}

// TestRLQSReleaseWakes: a proxy waiting for room gets its share as soon as another proxy's share
// shrinks, without reporting again and with no tick to wait for (--rlqs-tick 1h); with two
// replicas on one Redis, across replicas too (Redis PUBLISH).
func TestRLQSReleaseWakes(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	args := []string{"--rlqs", "--config", rules, "--rlqs-tick", "1h"}
	t.Run("one replica", func(t *testing.T) {
		t.Parallel()
		p := startRLS(t, nil, args...)
		releaseWakes(t, p.GRPCAddr, p.GRPCAddr)
	})
	t.Run("two replicas on one redis", func(t *testing.T) {
		t.Parallel()
		url := redistest.URL(t, redistest.SingleEnv)
		prefix := fmt.Sprintf("rlqs-wake-%d:", time.Now().UnixNano())
		ra := append([]string{"--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix}, args...)
		a, b := startRLS(t, nil, ra...), startRLS(t, nil, ra...)
		releaseWakes(t, a.GRPCAddr, b.GRPCAddr)
	})
}

// releaseWakes: proxy A alone takes nearly the whole limit; proxy B (on addrB) reports the same
// demand and gets nothing yet, A holding it all; A reports again and shrinks to half; B must then
// receive its half unasked.
func releaseWakes(t *testing.T, addrA, addrB string) {
	t.Helper()
	bucket := map[string]string{"api_key": "shared"}
	report := func(n uint64) *rlqspb.RateLimitQuotaUsageReports {
		return &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs",
			BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket, n, n, time.Second)}}
	}
	rate := func(s *typev3.RateLimitStrategy) uint32 { return s.GetTokenBucket().GetTokensPerFill().GetValue() }
	sa, err := rlqsClient(t, addrA).StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := rate(exchange(t, sa, report(2000))); got != 969 {
		t.Fatalf("A alone: rate %d, want 969", got)
	}
	sb, err := rlqsClient(t, addrB).StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := exchange(t, sb, report(2000)); got.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("B while A holds everything: %v, want DENY_ALL", got)
	}
	if got := rate(exchange(t, sa, report(2000))); got > 500 {
		t.Fatalf("A beside B: rate %d, want about half of 969", got)
	}
	type recv struct {
		resp *rlqspb.RateLimitQuotaResponse
		err  error
	}
	got := make(chan recv, 1)
	go func() {
		resp, err := sb.Recv()
		got <- recv{resp, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if n := rate(r.resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy()); n < 450 {
			t.Errorf("B woken with rate %d, want about half of 969", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B got nothing within 5 s of A releasing room: not woken")
	}
	sa.CloseSend()
	sb.CloseSend()
}

// TestRLQSManyBucketsLeave: a stream that reported thousands of buckets to replicas sharing
// Redis ends; every one of its shares is released in Redis (a round trip or two each) within
// the time rls allows, with no warning logged, where one at a time had run out of time and
// logged a warning per bucket.
func TestRLQSManyBucketsLeave(t *testing.T) {
	const n = 5000
	url := redistest.URL(t, redistest.SingleEnv)
	prefix := fmt.Sprintf("rlqs-leave-%d:", time.Now().UnixNano())
	p := startRLS(t, nil, "--rlqs", "--config", writeRules(t, map[string]string{"rlqs.yaml": rlqsRules}),
		"--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--rlqs-tick", "1h",
		"--rlqs-assignment-ttl", "60s") // the buckets' keys live for minutes, past any check below
	ctx, cancel := context.WithCancel(ctxT(t))
	s, err := rlqsClient(t, p.GRPCAddr).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs"}
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"api_key": fmt.Sprintf("k%d", i)}, 1, 0, time.Second))
	}
	if err := s.Send(m); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < n; {
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got += len(resp.GetBucketAction())
	}
	cancel()

	target, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(target)
	defer rdb.Close()
	held := func() (keys, holding int) {
		iter := rdb.Scan(context.Background(), 0, prefix+"rlqs:*", 1000).Iterator()
		for iter.Next(context.Background()) {
			keys++
			fields, err := rdb.HGetAll(context.Background(), iter.Val()).Result()
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range fields {
				// A proxy's field: demand, seen-until (0 once released), held rate, burst, until.
				if f := strings.Fields(v); !strings.HasPrefix(name, "~") && len(f) == 5 && f[1] != "0" {
					holding++
				}
			}
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return keys, holding
	}
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		keys, holding := held()
		if keys != n {
			t.Fatalf("%d bucket keys in Redis, want %d", keys, n)
		}
		if holding == 0 {
			t.Logf("all %d released within %v of the stream's end", n, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d of %d buckets still count the ended stream's demand 5 s after it ended\n%s", holding, n, p.Output())
		}
	}
	if c := strings.Count(p.Output(), "could not release"); c > 0 {
		t.Errorf("%d warnings about releases:\n%s", c, p.Output())
	}
}

// TestRLQSStateLost: when Redis loses a bucket's state (flushed, restarted), a proxy that
// reported demand keeps a share at the next tick, decided from the demand its stream last
// reported, rather than DENY_ALL as if it wanted nothing.
func TestRLQSStateLost(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	prefix := fmt.Sprintf("rlqs-lost-%d:", time.Now().UnixNano())
	p := startRLS(t, nil, "--rlqs", "--config", writeRules(t, map[string]string{"rlqs.yaml": rlqsRules}),
		"--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--rlqs-tick", "50ms")
	s, err := rlqsClient(t, p.GRPCAddr).StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	rate := func(st *typev3.RateLimitStrategy) uint32 { return st.GetTokenBucket().GetTokensPerFill().GetValue() }
	got := exchange(t, s, &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": "shared"}, 1000, 1000, time.Second)}})
	if rate(got) != 969 {
		t.Fatalf("first report: %v, want a token bucket of 969", got)
	}
	target, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(target)
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), prefix+"rlqs:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("bucket keys %v, err %v: want one", keys, err)
	}
	if err := rdb.Del(context.Background(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
	// The ticks that follow decide again and send the share anew (the store's record of it is
	// gone); every assignment they send must still admit.
	type recv struct {
		resp *rlqspb.RateLimitQuotaResponse
		err  error
	}
	ch := make(chan recv, 16)
	go func() {
		for {
			r, err := s.Recv()
			ch <- recv{r, err}
			if err != nil {
				return
			}
		}
	}()
	sent := 0
	deadline := time.After(time.Second)
	for {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatal(r.err)
			}
			for _, a := range r.resp.GetBucketAction() {
				sent++
				if st := a.GetQuotaAssignmentAction().GetRateLimitStrategy(); rate(st) == 0 {
					t.Fatalf("after the bucket's state was lost: %v, want a share for the demand reported", st)
				}
			}
		case <-deadline:
			if sent == 0 {
				t.Fatal("no assignment within a second of the bucket's state being lost (ticks every 50 ms)")
			}
			return
		}
	}
}
