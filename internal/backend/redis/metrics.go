package redis

import "github.com/prometheus/client_golang/prometheus"

// The Backend's metrics, read when scraped.
var (
	nodeUpDesc = prometheus.NewDesc("rls_redis_node_up",
		"1 while the Redis master answers, 0 while its circuit breaker is open: the single node, the Sentinel's master (node=\"sentinel:<name>\") or each master of the Cluster's slot map.",
		[]string{"node"}, nil)
	slotsDesc = prometheus.NewDesc("rls_redis_slots_unavailable",
		"Redis Cluster hash slots whose master is down or that no master serves: their decisions get the failure mode, the others are decided as usual.",
		nil, nil)
	slowDesc = prometheus.NewDesc("rls_redis_slow_total",
		"Decisions that ran out of their budget while a probe of their Redis node on its own connection had no answer either: Redis slow or hung, not rls overloaded. Also counted in rls_backend_errors_total{kind=\"timeout\"}.",
		[]string{"node"}, nil)
	resetsDesc = prometheus.NewDesc("rls_redis_state_resets_total",
		"Times a Redis node was found to have lost its data (a flush, a restart without persistence): its epoch key gone or changed. Every key it held started over with a fresh burst.",
		nil, nil)
	evictedDesc = prometheus.NewDesc("rls_redis_evicted_keys_total",
		"Keys the Redis node evicted for want of memory (its INFO evicted_keys, read every --redis-health-interval while rls runs), rls's or, on a Redis shared with others, theirs. Each rate-limit key evicted starts over with a fresh burst.",
		[]string{"node"}, nil)
	oomDesc = prometheus.NewDesc("rls_redis_oom_total",
		"Script calls the Redis node refused for want of memory (OOM command not allowed: maxmemory reached under maxmemory-policy noeviction, or nothing left to evict): their decisions got the failure mode. The node answered: its circuit breaker stays closed.",
		[]string{"node"}, nil)
	reloadsDesc = prometheus.NewDesc("rls_redis_topology_reloads_total",
		"Reloads of the Redis Cluster slot map, by what asked for it: moved, ask (a redirect), node_down (a master failing or down), clusterdown, no_map, periodic.",
		[]string{"reason"}, nil)

	leaseDecisionsDesc = prometheus.NewDesc("rls_redis_lease_decisions_total",
		"Decisions answered from leases, without Redis: every hit of them was charged in Redis before, with a lease (see --redis-lease-lifetime).",
		nil, nil)
	leasesDesc = prometheus.NewDesc("rls_redis_leases_total",
		"Leases charged in Redis: each carried by a decision that went there, and admitting up to its hits here.",
		nil, nil)
	leaseReturnedDesc = prometheus.NewDesc("rls_redis_lease_hits_returned_total",
		"Hits that leases did not use, given back to Redis when they ended (their time, a rule reload, shutdown).",
		nil, nil)
	leaseDroppedDesc = prometheus.NewDesc("rls_redis_lease_hits_dropped_total",
		"Hits that leases did not use and could not give back: a failed refund, or a fixed window too close to its end. Each holds back one hit until the key's rate restores it (GCRA) or its window ends.",
		nil, nil)
	leaseExpiredDesc = prometheus.NewDesc("rls_redis_lease_hits_expired_total",
		"Hits that leases did not use and did not give back because time had already restored them: the give-back reached Redis after its lease expired (this process paused, throttled or starved), or the key's rate had restored them since the lease was charged.",
		nil, nil)
	leaseHeldDesc = prometheus.NewDesc("rls_redis_lease_hits_held",
		"Hits charged in Redis with leases and neither used nor given back yet.",
		nil, nil)
)

// Collector returns the Backend's metrics.
func (b *Backend) Collector() prometheus.Collector { return collector{b} }

type collector struct{ b *Backend }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeUpDesc
	ch <- slowDesc
	ch <- resetsDesc
	ch <- evictedDesc
	ch <- oomDesc
	if c.b.leases != nil {
		ch <- leaseDecisionsDesc
		ch <- leasesDesc
		ch <- leaseReturnedDesc
		ch <- leaseDroppedDesc
		ch <- leaseExpiredDesc
		ch <- leaseHeldDesc
	}
	if c.b.cluster {
		ch <- slotsDesc
		ch <- reloadsDesc
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	b := c.b
	up := func(n *node) float64 {
		if n.br.Allow() {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(resetsDesc, prometheus.CounterValue, float64(b.resets.Load()))
	if l := b.leases; l != nil {
		ch <- prometheus.MustNewConstMetric(leaseDecisionsDesc, prometheus.CounterValue, float64(l.local.Load()))
		ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.CounterValue, float64(l.taken.Load()))
		ch <- prometheus.MustNewConstMetric(leaseReturnedDesc, prometheus.CounterValue, float64(l.returned.Load()))
		ch <- prometheus.MustNewConstMetric(leaseDroppedDesc, prometheus.CounterValue, float64(l.dropped.Load()))
		ch <- prometheus.MustNewConstMetric(leaseExpiredDesc, prometheus.CounterValue, float64(l.expired.Load()))
		ch <- prometheus.MustNewConstMetric(leaseHeldDesc, prometheus.GaugeValue, float64(l.held.Load()))
	}
	if !b.cluster {
		ch <- prometheus.MustNewConstMetric(nodeUpDesc, prometheus.GaugeValue, up(b.single), b.single.name)
		b.single.collect(ch)
		return
	}
	if t := b.topo.Load(); t != nil {
		for _, n := range t.masters {
			ch <- prometheus.MustNewConstMetric(nodeUpDesc, prometheus.GaugeValue, up(n), n.name)
		}
	}
	ch <- prometheus.MustNewConstMetric(slotsDesc, prometheus.GaugeValue, float64(b.slotsDown()))
	for _, n := range b.topo.live() {
		n.collect(ch)
	}
	for i, r := range reloadReasons {
		ch <- prometheus.MustNewConstMetric(reloadsDesc, prometheus.CounterValue, float64(b.topo.reloads[i].Load()), r)
	}
}

// collect sends the node's own counters.
func (n *node) collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(slowDesc, prometheus.CounterValue, float64(n.slow.Load()), n.name)
	ch <- prometheus.MustNewConstMetric(evictedDesc, prometheus.CounterValue, float64(n.evicted.Load()), n.name)
	ch <- prometheus.MustNewConstMetric(oomDesc, prometheus.CounterValue, float64(n.oom.Load()), n.name)
}
