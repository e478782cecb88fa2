package statsd

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Derived counters are envoyproxy/ratelimit's counters that rls's own metrics already count: read
// from a gatherer at each flush or scrape rather than counted twice.
type derived struct {
	stat   string            // statsd name
	metric string            // Prometheus name, as the default mapper gives it
	labels map[string]string // its labels
	from   string            // rls's metric
	match  map[string]string // the label values of rls's metric summed (any value for "")
	tagged bool              // under the "ratelimit" scope, which EXTRA_TAGS tag
}

var derivedCounters = []derived{
	{stat: "ratelimit.service.call.should_rate_limit.redis_error", metric: "ratelimit_service_should_rate_limit_error",
		labels: map[string]string{"err_type": "redis_error"}, from: "rls_backend_errors_total", match: map[string]string{"kind": "timeout|unavailable"}, tagged: true},
	{stat: "ratelimit.service.call.should_rate_limit.service_error", metric: "ratelimit_service_should_rate_limit_error",
		labels: map[string]string{"err_type": "service_error"}, from: "rls_backend_errors_total", match: map[string]string{"kind": "other"}, tagged: true},
	{stat: "ratelimit.service.config_load_success", metric: "ratelimit_service_config_load_success",
		from: "rls_config_loads_total", match: map[string]string{"result": "success"}, tagged: true},
	{stat: "ratelimit.service.config_load_error", metric: "ratelimit_service_config_load_error",
		from: "rls_config_loads_total", match: map[string]string{"result": "failure"}, tagged: true},
	{stat: "ratelimit_server.ShouldRateLimit.total_requests", metric: "ratelimit_service_total_requests",
		labels: map[string]string{"grpc_method": "ShouldRateLimit"}, from: "grpc_server_handled_total", match: map[string]string{"grpc_method": "ShouldRateLimit"}},
}

// readDerived returns each derived counter's value, in derivedCounters' order; nil g: none.
func readDerived(g prometheus.Gatherer) []uint64 {
	if g == nil {
		return nil
	}
	mfs, _ := g.Gather() // what could be gathered, also on a partial error
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	out := make([]uint64, len(derivedCounters))
	for i, d := range derivedCounters {
		mf := byName[d.from]
		if mf == nil {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			if matches(m, d.match) {
				sum += m.GetCounter().GetValue()
			}
		}
		out[i] = uint64(sum)
	}
	return out
}

// matches says whether m's labels take one of the '|'-separated values match names for each.
func matches(m *dto.Metric, match map[string]string) bool {
	for name, want := range match {
		ok := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == name && oneOf(lp.GetValue(), want) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func oneOf(v, alternatives string) bool {
	return strings.Contains("|"+alternatives+"|", "|"+v+"|")
}
