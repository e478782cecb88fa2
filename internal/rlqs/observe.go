package rlqs

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/httpjson"
)

// The per-rule gauges, computed from the streams at each scrape.
var (
	proxiesDesc = prometheus.NewDesc("rls_rlqs_proxies",
		"Proxies (RLQS streams on this replica) reporting buckets of the rule.", []string{"domain", "rule"}, nil)
	bucketsDesc = prometheus.NewDesc("rls_rlqs_buckets",
		"Bucket subscriptions (proxy × bucket) of the rule on this replica.", []string{"domain", "rule"}, nil)
	assignedDesc = prometheus.NewDesc("rls_rlqs_assigned_rate",
		"Requests per second assigned to this replica's proxies for buckets of the rule (token bucket fill rates).", []string{"domain", "rule"}, nil)
	demandDesc = prometheus.NewDesc("rls_rlqs_demand_rate",
		"Requests per second this replica's proxies last reported for buckets of the rule (allowed + denied).", []string{"domain", "rule"}, nil)
	streamsDesc = prometheus.NewDesc("rls_rlqs_streams", "Open RLQS streams.", nil, nil)
	storeDesc   = prometheus.NewDesc("rls_rlqs_store_buckets",
		"Buckets the in-memory share store keeps (proxies' demand and held shares; absent with Redis).", nil, nil)
)

type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{proxiesDesc, bucketsDesc, assignedDesc, demandDesc, streamsDesc, storeDesc,
		totalBucketsDesc, bucketBytesDesc} {
		ch <- d
	}
}

var (
	totalBucketsDesc = prometheus.NewDesc("rls_rlqs_stream_buckets",
		"Buckets of the open RLQS streams together (stream × bucket), against --rlqs-max-total-buckets.", nil, nil)
	bucketBytesDesc = prometheus.NewDesc("rls_rlqs_bucket_id_bytes",
		"Bytes of the distinct bucket ids of the open RLQS streams, against --rlqs-max-bucket-bytes.", nil, nil)
)

// Collect reads the per-rule gauges that tally keeps: its cost is the number of rules with
// buckets (rules are the operator's), not the number of buckets.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	streams, subs, idBytes := len(s.streams), s.subs, s.idBytes
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(streamsDesc, prometheus.GaugeValue, float64(streams))
	ch <- prometheus.MustNewConstMetric(totalBucketsDesc, prometheus.GaugeValue, float64(subs))
	ch <- prometheus.MustNewConstMetric(bucketBytesDesc, prometheus.GaugeValue, float64(idBytes))
	if m, ok := s.store.(*Memory); ok {
		ch <- prometheus.MustNewConstMetric(storeDesc, prometheus.GaugeValue, float64(m.Len()))
	}
	s.aggMu.Lock()
	defer s.aggMu.Unlock()
	for k, a := range s.aggs {
		ch <- prometheus.MustNewConstMetric(proxiesDesc, prometheus.GaugeValue, float64(a.proxies), k.domain, k.rule)
		ch <- prometheus.MustNewConstMetric(bucketsDesc, prometheus.GaugeValue, float64(a.buckets), k.domain, k.rule)
		ch <- prometheus.MustNewConstMetric(assignedDesc, prometheus.GaugeValue, float64(a.assigned)/micro, k.domain, k.rule)
		ch <- prometheus.MustNewConstMetric(demandDesc, prometheus.GaugeValue, float64(a.demand)/micro, k.domain, k.rule)
	}
}

// aggKey is a metric's labels: a domain label and a rule name.
type aggKey struct{ domain, rule string }

// agg is one rule's gauges: proxies (streams with a bucket of it), buckets, and the rates
// assigned and demanded, in millionths of a request per second, summed exactly.
type agg struct {
	proxies, buckets int
	assigned, demand int64
}

// micro is the unit of agg's rates: a millionth of a request per second.
const micro = 1e6

// toMicro is a rate in millionths, bounded so that sums of many cannot overflow.
func toMicro(v float64) int64 {
	if !(v > 0) {
		return 0
	}
	return int64(math.Round(min(v, 1e9) * micro))
}

// tally counts b, as it is now, in the per-rule gauges; untally takes it out. Every change of
// what they read (the rule, the demand, the share sent) is made between the two. st.mu must be
// held.
func (s *Server) tally(st *stream, b *streamBucket) { s.tallyBy(st, b, 1) }

func (s *Server) untally(st *stream, b *streamBucket) { s.tallyBy(st, b, -1) }

func (s *Server) tallyBy(st *stream, b *streamBucket, sign int) {
	if b.tallied == (sign > 0) || b.rules == nil && sign > 0 {
		return
	}
	b.tallied = sign > 0
	k := aggKey{domainLabel(b.rules, st.domain), ruleName(b.pol.rule)}
	var assigned int64
	if b.sent && !b.allowAll && b.pol.lim.PeriodMs > 0 {
		assigned = toMicro(float64(b.share.Rate) * 1000 / float64(b.pol.lim.PeriodMs))
	}
	s.aggMu.Lock()
	defer s.aggMu.Unlock()
	a := s.aggs[k]
	if a == nil {
		a = &agg{}
		s.aggs[k] = a
	}
	if st.tallies == nil {
		st.tallies = map[aggKey]int{}
	}
	st.tallies[k] += sign
	switch n := st.tallies[k]; {
	case n == 0:
		delete(st.tallies, k)
		a.proxies--
	case n == 1 && sign > 0:
		a.proxies++
	}
	a.buckets += sign
	a.assigned += int64(sign) * assigned
	a.demand += int64(sign) * toMicro(b.demand)
	if a.buckets == 0 {
		delete(s.aggs, k)
	}
}

func (s *Server) snapshotStreams() []*stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		out = append(out, st)
	}
	return out
}

// Streams is the number of open streams.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

type assignmentJSON struct {
	Proxy    string    `json:"proxy"`
	Domain   string    `json:"domain"`
	Bucket   string    `json:"bucket"`
	Rule     string    `json:"rule"`
	Source   string    `json:"source,omitempty"`
	Demand   float64   `json:"demand_per_second"`
	Strategy string    `json:"strategy"`
	Rate     int64     `json:"rate,omitempty"`
	Burst    int64     `json:"burst,omitempty"`
	Period   string    `json:"period,omitempty"`
	SentAt   time.Time `json:"sent_at,omitzero"`
}

func strategyName(b *streamBucket) string {
	switch {
	case !b.sent:
		return "none"
	case b.allowAll:
		return "allow_all"
	case b.share.Rate == 0:
		return "deny_all"
	}
	return "token_bucket"
}

// AssignmentsHandler serves GET /debug/rlqs[?limit=N]: the assignments this replica's streams
// hold, by domain, bucket and proxy; at most N of them (DefaultDebugBuckets unless asked for
// fewer, or more up to maxDebugBuckets), with "buckets" saying how many there are in all and
// "truncated" whether some were left out. Its cost is bounded by N and the streams, not by the
// buckets.
func (s *Server) AssignmentsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := DefaultDebugBuckets
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > maxDebugBuckets {
				httpjson.Write(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("limit %q: want 0 to %d", v, maxDebugBuckets)})
				return
			}
			limit = n
		}
		out := []assignmentJSON{}
		for _, st := range s.snapshotStreams() {
			st.mu.Lock()
			for _, b := range st.buckets {
				if len(out) >= limit {
					break
				}
				_, id, _ := entries(b.key)
				a := assignmentJSON{Proxy: st.id, Domain: st.domain, Bucket: id.String(), Rule: ruleName(b.pol.rule),
					Demand: b.demand, Strategy: strategyName(b), SentAt: b.sentAt}
				if b.pol.rule != nil {
					a.Source = b.pol.rule.Source
				}
				if a.Strategy == "token_bucket" {
					a.Rate, a.Burst, a.Period = b.share.Rate, max(b.share.Burst, 1), ttlDuration(b.pol.lim.PeriodMs).String()
				}
				out = append(out, a)
			}
			st.mu.Unlock()
			if len(out) >= limit {
				break
			}
		}
		slices.SortFunc(out, func(a, b assignmentJSON) int {
			return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Bucket, b.Bucket), strings.Compare(a.Proxy, b.Proxy))
		})
		s.mu.Lock()
		streams, subs := len(s.streams), s.subs
		s.mu.Unlock()
		httpjson.Write(w, http.StatusOK, map[string]any{"ttl": s.ttl.String(), "streams": streams, "buckets": subs,
			"truncated": len(out) < subs, "assignments": out})
	})
}

// maxDebugBuckets is the most assignments /debug/rlqs lists at once.
const maxDebugBuckets = 100000

type explainProxyJSON struct {
	Proxy        string    `json:"proxy"`
	Demand       float64   `json:"demand_per_second"`
	DemandCounts bool      `json:"demand_counts"`
	Target       int64     `json:"target_rate"`
	HeldRate     int64     `json:"held_rate"`
	HeldBurst    int64     `json:"held_burst"`
	HeldUntil    time.Time `json:"held_until,omitzero"`
}

// ExplainHandler serves GET /debug/rlqs/explain?domain=D&bucket=k=v&bucket=k2=v2: the rule a
// bucket id maps to and in which key order, the limit divided, and every proxy's demand, target
// and held share as the store has them.
func (s *Server) ExplainHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		domain := q.Get("domain")
		m := map[string]string{}
		for _, kv := range q["bucket"] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				httpjson.Write(w, http.StatusBadRequest, map[string]string{"error": "bucket " + kv + ": want key=value"})
				return
			}
			m[k] = v
		}
		if domain == "" {
			httpjson.Write(w, http.StatusBadRequest, map[string]string{"error": "want ?domain=D&bucket=key=value[&bucket=key2=value2]"})
			return
		}
		id, err := parseBucketID(m)
		if err != nil {
			httpjson.Write(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		rs := s.rules()
		rule, order := match(rs, domain, id)
		pol := policyOf(rule)
		out := map[string]any{"domain": domain, "bucket": id.String()}
		if rule == nil {
			why := "no rules loaded"
			if rs != nil {
				_, why = rs.Explain(domain, id)
			}
			out["rule"] = nil
			out["why"] = why
			out["strategy"] = "allow_all: a bucket that matches no rule is not limited, as ShouldRateLimit answers OK for it"
			httpjson.Write(w, http.StatusOK, out)
			return
		}
		keys := make([]string, len(order))
		for i, e := range order {
			keys[i] = e.Key
		}
		out["rule"] = map[string]any{"path": rule.Path, "source": rule.Source}
		out["matched_key_order"] = keys
		if pol.allowAll {
			out["strategy"] = "allow_all: the rule does not limit (allow-listed, unlimited or shadow mode)"
			httpjson.Write(w, http.StatusOK, out)
			return
		}
		out["limit"] = map[string]any{"rate": pol.lim.Rate, "period": ttlDuration(pol.lim.PeriodMs).String(), "burst": pol.lim.Burst, "name": rule.Limits[pol.index].Name}
		state, err := s.store.Peek(r.Context(), id.key(domain))
		if err != nil {
			httpjson.Write(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		now := s.now().UnixMilli()
		bs := newBucketState()
		for id, p := range state {
			bs.proxies[id] = &p
		}
		targets := bs.targets(pol.lim, now)
		var proxies []explainProxyJSON
		var held int64
		for _, pid := range sortedIDs(state) {
			p := state[pid]
			e := explainProxyJSON{Proxy: pid, Demand: p.Demand, DemandCounts: p.SeenUntil >= now, Target: targets[pid]}
			if p.HoldUntil >= now {
				e.HeldRate, e.HeldBurst, e.HeldUntil = p.Held.Rate, p.Held.Burst, time.UnixMilli(p.HoldUntil)
				held += p.Held.Rate
			}
			proxies = append(proxies, e)
		}
		out["proxies"] = proxies
		out["held_rate"] = held
		out["strategy"] = "max-min fair shares of the rate by demand, each capped by what the other proxies hold"
		httpjson.Write(w, http.StatusOK, out)
	})
}
