package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
)

// mrRate and mrBurst are the global limit of every key of the multi-region tests: per second.
const (
	mrRate  = 20
	mrBurst = 10
)

// multiRegion is three regions on this machine, each its own redis-server and two rls
// processes, and a coordination store that every region reaches through its own toxiproxy
// link (latency with jitter; cut and healed by the tests). rls ↔ its region's Redis is direct.
type multiRegion struct {
	t       *testing.T
	global  *redistest.Server
	toxics  *toxiproxy.ApiServer
	links   map[string]*toxiproxy.Proxy
	regions []string
	rls     map[string][]*rlsProc
	clients map[string][]rlsv3.RateLimitServiceClient
	lease   time.Duration
	delta   time.Duration
}

func startMultiRegion(t *testing.T, latency, jitter time.Duration) *multiRegion {
	m := &multiRegion{
		t: t, global: redistest.Start(t), regions: []string{"eu", "us", "ap"},
		links: map[string]*toxiproxy.Proxy{}, rls: map[string][]*rlsProc{}, clients: map[string][]rlsv3.RateLimitServiceClient{},
		lease: 3 * time.Second, delta: 250 * time.Millisecond,
	}
	m.toxics = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	rules := writeRules(t, map[string]string{"shop.yaml": fmt.Sprintf(`domain: shop
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: %d, burst: %d, global: true}
  - key: local
    rate_limit: {unit: second, requests_per_unit: %d, burst: %d}
`, mrRate, mrBurst, mrRate, mrBurst)})
	for _, region := range m.regions {
		link := toxiproxy.NewProxy(m.toxics, region, "127.0.0.1:0", m.global.Addr())
		if err := link.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(link.Stop)
		m.links[region] = link
		m.setLatency(region, latency, jitter)
		local := redistest.Start(t)
		for range 2 {
			p := startRLS(t, nil, "--backend", "redis", "--redis-url", local.URL(), "--config", rules,
				"--region", region, "--global-url", "redis://"+link.Listen,
				"--global-interval", m.delta.String(), "--global-lease", m.lease.String(),
				"--global-table-lease", "500ms", "--global-margin", "100ms", "--redis-timeout", "1s")
			m.rls[region] = append(m.rls[region], p)
			m.clients[region] = append(m.clients[region], p.client(t))
		}
	}
	return m
}

// setLatency sets the one-way latency (and its jitter) of region's link, both ways.
func (m *multiRegion) setLatency(region string, latency, jitter time.Duration) {
	m.t.Helper()
	link := m.links[region]
	for _, stream := range []string{"upstream", "downstream"} {
		name := "latency_" + stream
		body := fmt.Sprintf(`{"name":%q,"type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d,"jitter":%d}}`,
			name, stream, latency.Milliseconds(), jitter.Milliseconds())
		if link.Toxics.GetToxic(name) != nil {
			if _, err := link.Toxics.UpdateToxicJson(name, strings.NewReader(body)); err != nil {
				m.t.Fatal(err)
			}
			continue
		}
		if _, err := link.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			m.t.Fatal(err)
		}
	}
}

// cut makes region's link drop everything (connections stay open, nothing arrives) until heal.
func (m *multiRegion) cut(region string) {
	m.t.Helper()
	body := `{"name":"cut","type":"timeout","stream":"upstream","toxicity":1,"attributes":{"timeout":0}}`
	if _, err := m.links[region].Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		m.t.Fatal(err)
	}
}

func (m *multiRegion) heal(region string) {
	m.t.Helper()
	if err := m.links[region].Toxics.RemoveToxic(context.Background(), "cut"); err != nil {
		m.t.Fatal(err)
	}
}

// decision is one answer the load driver got: when it was asked and answered, where, for what.
type decision struct {
	sent, got time.Time
	region    string
	key       string
	ok        bool
	err       bool
}

// recorder keeps every decision.
type recorder struct {
	mu  sync.Mutex
	all []decision
}

func (r *recorder) add(d decision) {
	r.mu.Lock()
	r.all = append(r.all, d)
	r.mu.Unlock()
}

func (r *recorder) of(key string) []decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []decision
	for _, d := range r.all {
		if d.key == key {
			out = append(out, d)
		}
	}
	return out
}

// demand says how many requests per second region offers key at instant since the start.
type demand func(region string, since time.Duration) float64

// drive offers key's demand from every region for d, spread over the region's rls processes,
// recording every decision.
func (m *multiRegion) drive(ctx context.Context, rec *recorder, descKey, key string, want demand, d time.Duration) {
	var wg sync.WaitGroup
	start := time.Now()
	for _, region := range m.regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := start
			for i := 0; ; i++ {
				since := time.Since(start)
				if since >= d || ctx.Err() != nil {
					return
				}
				rate := want(region, since)
				if rate <= 0 {
					time.Sleep(10 * time.Millisecond)
					next = time.Now()
					continue
				}
				next = next.Add(time.Duration(float64(time.Second) / rate))
				if wait := time.Until(next); wait > 0 {
					time.Sleep(wait)
				}
				c := m.clients[region][i%len(m.clients[region])]
				go func() {
					cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					sent := time.Now()
					resp, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{
						{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: descKey, Value: key}}}}})
					rec.add(decision{sent: sent, got: time.Now(), region: region, key: key,
						ok: err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK, err: err != nil})
				}()
			}
		}()
	}
	wg.Wait()
}

// worstExcess returns, over every window of length T, the most by which the requests admitted
// in it exceed b + r·T (negative: below the bound). A decision happens somewhere between its
// sending and its answer: a request counts in a window when that span meets the window, which
// can only count more than happened, so the check is sound.
func worstExcess(ds []decision, T time.Duration) float64 {
	var ok []decision
	for _, d := range ds {
		if d.ok {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		return -(mrBurst + mrRate*T.Seconds())
	}
	// For a window [t, t+T]: admitted with got ≥ t and sent ≤ t+T. The worst t is an answer's
	// instant (a window that starts at one: sliding it later loses nothing on the left until
	// then).
	bySent := slices.Clone(ok)
	sort.Slice(bySent, func(i, j int) bool { return bySent[i].sent.Before(bySent[j].sent) })
	byGot := slices.Clone(ok)
	sort.Slice(byGot, func(i, j int) bool { return byGot[i].got.Before(byGot[j].got) })
	worst := -1e18
	for i, d := range byGot {
		t := d.got
		// byGot[i:] have got ≥ t; of them, those sent ≤ t+T.
		end := t.Add(T)
		n := 0
		for _, e := range byGot[i:] {
			if !e.sent.After(end) {
				n++
			}
		}
		worst = max(worst, float64(n)-(mrBurst+mrRate*T.Seconds()))
	}
	return worst
}

// TestMultiRegionExact runs several demand patterns at once, each on keys of its own, over three
// regions whose links to the coordination store have 25–75 ms of one-way latency, and checks that
// what all regions admitted together in every window stays within b + r·T.
func TestMultiRegionExact(t *testing.T) {
	m := startMultiRegion(t, 50*time.Millisecond, 25*time.Millisecond)
	ctx := ctxT(t)
	rec := &recorder{}
	const run = 12 * time.Second
	patterns := map[string]func(seed uint64) demand{
		// Demand spread evenly: each region 1.5 r.
		"even": func(uint64) demand { return func(string, time.Duration) float64 { return 1.5 * mrRate } },
		// All demand in one region.
		"one": func(seed uint64) demand {
			home := m.regions[seed%3]
			return func(r string, _ time.Duration) float64 {
				if r == home {
					return 3 * mrRate
				}
				return 0
			}
		},
		// Demand moving between regions every Δ.
		"moving": func(seed uint64) demand {
			return func(r string, since time.Duration) float64 {
				if m.regions[(int(since/m.delta)+int(seed))%3] == r {
					return 3 * mrRate
				}
				return 0.2 * mrRate
			}
		},
		// Synchronised bursts in every region after quiet periods.
		"bursts": func(seed uint64) demand {
			rng := rand.New(rand.NewPCG(seed, 7))
			quiet := time.Duration(1+rng.IntN(2)) * time.Second
			return func(_ string, since time.Duration) float64 {
				if since%(quiet+time.Second) < quiet {
					return 0
				}
				return 5 * mrRate
			}
		},
	}
	var wg sync.WaitGroup
	var keys []string
	for name, p := range patterns {
		for seed := range uint64(5) {
			key := fmt.Sprintf("%s-%d", name, seed)
			keys = append(keys, key)
			wg.Add(1)
			go func() {
				defer wg.Done()
				m.drive(ctx, rec, "user", key, p(seed), run)
			}()
		}
	}
	wg.Wait()
	time.Sleep(time.Second) // answers in flight
	worst := map[time.Duration]float64{}
	for _, key := range keys {
		ds := rec.of(key)
		for _, T := range []time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second, run} {
			e := worstExcess(ds, T)
			if v, ok := worst[T]; !ok || e > v {
				worst[T] = e
			}
			if e > 0 {
				t.Errorf("key %s: %v window: %.0f admitted above b + r·T", key, T, e)
			}
		}
	}
	t.Logf("worst (admitted − (b + r·T)) over %d keys (4 patterns × 5 seeds): %v", len(keys), worst)
}
