package statsd

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector serves a Store's counters, and the derived ones, as the Prometheus series that
// envoyproxy/ratelimit's default statsd mapper (its src/stats/prom/default_mapper.yaml) makes of
// its statsd names: ratelimit_service_rate_limit_<counter>{domain, key1} for a one-level key,
// {domain, key1, key2} for a deeper one (its first two levels), and
// ratelimit_service_should_rate_limit_error{err_type}, ratelimit_service_config_load_success,
// ratelimit_service_config_load_error and ratelimit_service_total_requests{grpc_method}. As
// there, a counter appears once it is above 0. It is unchecked (it describes nothing): its
// series do not all have the same labels, as the mapper's do not.
type Collector struct {
	store *Store
	gath  prometheus.Gatherer // for the derived counters; nil: none
}

// NewCollector returns the collector of store's counters and of g's derived ones.
func NewCollector(store *Store, g prometheus.Gatherer) *Collector {
	return &Collector{store: store, gath: g}
}

// Describe describes nothing: the collector is unchecked.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect sends every counter above 0.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	descs := map[string]*prometheus.Desc{}
	desc := func(name string, labels []string) *prometheus.Desc {
		k := name + "\x00" + strings.Join(labels, "\x00")
		d := descs[k]
		if d == nil {
			d = prometheus.NewDesc(name, "envoyproxy/ratelimit's counter, as its default statsd mapper names it.", labels, nil)
			descs[k] = d
		}
		return d
	}
	for _, sr := range c.store.Series() {
		labels, values, ok := MapKey(sr.Key)
		if !ok {
			continue
		}
		for i, n := range counterNames {
			if v := sr.c[i].Load(); v > 0 {
				ch <- prometheus.MustNewConstMetric(desc("ratelimit_service_rate_limit_"+n, labels), prometheus.CounterValue, float64(v), values...)
			}
		}
	}
	for i, v := range readDerived(c.gath) {
		if v == 0 {
			continue
		}
		d := derivedCounters[i]
		var names, values []string
		for k, val := range d.labels {
			names, values = append(names, k), append(values, val)
		}
		ch <- prometheus.MustNewConstMetric(desc(d.metric, names), prometheus.CounterValue, float64(v), values...)
	}
}

// MapKey is what envoyproxy/ratelimit's default mapper makes of a stats key
// ("domain.key1.key2..."): its labels and their values; ok is false for a key it maps to nothing
// (a single level, the overflow series).
func MapKey(key string) (labels, values []string, ok bool) {
	parts := strings.SplitN(key, ".", 4)
	switch len(parts) {
	case 2:
		return []string{"domain", "key1"}, parts, true
	case 3, 4:
		return []string{"domain", "key1", "key2"}, parts[:3], true
	}
	return nil, nil, false
}
