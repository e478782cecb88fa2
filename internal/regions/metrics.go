package regions

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeStats is what a node's metrics read: set by its loops, read at a scrape.
type nodeStats struct {
	agent, coordinator atomic.Bool
	tableKeys          atomic.Int64
	fetched            atomic.Int64  // mono ns of the last fetch that succeeded (0: none)
	replied            atomic.Int64  // mono ns of the last reply taken (agent)
	leaseEnd           atomic.Int64  // mono ns, the agent's lease's end
	held, demand       atomic.Uint64 // agent: Σ over keys, requests a second, as float64 bits
	grants             atomic.Uint64 // coordinator: grants made
	steps, failures    atomic.Uint64 // coordinator: steps committed, failed
	refused            atomic.Uint64 // agent: keys not reported, --global-max-keys being known
	late               atomic.Uint64 // decisions answered after their shares' instant: denied
}

var (
	descRole       = prometheus.NewDesc("rls_global_role", "1 when this replica holds the role (agent: its region's; coordinator: of every region's), else 0.", []string{"role"}, nil)
	descTableKeys  = prometheus.NewDesc("rls_global_table_keys", "Global keys in this replica's table of its region's shares.", nil, nil)
	descTableAge   = prometheus.NewDesc("rls_global_table_age_seconds", "Since this replica last fetched its region's table (a replica applies a table for at most --global-table-lease).", nil, nil)
	descLag        = prometheus.NewDesc("rls_global_coordination_lag_seconds", "Agent: since the last reply of the coordinator was taken.", nil, nil)
	descLease      = prometheus.NewDesc("rls_global_lease_remaining_seconds", "Agent: until the region's lease ends; below 0 once ended (the region applies its safe shares).", nil, nil)
	descCutOff     = prometheus.NewDesc("rls_global_cut_off", "Agent: 1 while the region's lease has ended (cut off from the coordination store, or from its coordinator), else 0.", nil, nil)
	descHeld       = prometheus.NewDesc("rls_global_shares_held_rate", "Agent: the region's shares of every global key, summed, in requests a second.", nil, nil)
	descDemand     = prometheus.NewDesc("rls_global_demand_rate", "Agent: the region's demand of every global key, summed, in requests a second.", nil, nil)
	descGrants     = prometheus.NewDesc("rls_global_reallocations_total", "Coordinator: shares granted (each a new version of a region's share of a key).", nil, nil)
	descSteps      = prometheus.NewDesc("rls_global_coordinator_steps_total", "Coordinator: steps committed to the coordination store.", nil, nil)
	descRefused    = prometheus.NewDesc("rls_global_keys_refused_total", "Agent: global keys asked for but not reported (no share: denied) because --global-max-keys were known.", nil, nil)
	descLate       = prometheus.NewDesc("rls_global_late_total", "Decisions on global keys answered after the instant their region's share was good until (this process paused or starved between reading its share and Redis's answer): denied, since Redis may have decided them after the share moved to other regions; what they charged stays charged.", nil, nil)
	descStepErrors = prometheus.NewDesc("rls_global_coordinator_step_errors_total", "Coordinator: steps that failed (the store did not answer, or the role was lost).", nil, nil)
)

// Collector returns the node's metrics, labelled with its region.
func (n *Node) Collector() prometheus.Collector { return &collector{n} }

type collector struct{ n *Node }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRole, descTableKeys, descTableAge, descLag, descLease, descCutOff, descHeld,
		descDemand, descGrants, descSteps, descStepErrors, descRefused, descLate} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s, now := &c.n.stats, c.n.mono()
	since := func(t int64) float64 { return time.Duration(now - t).Seconds() }
	ch <- prometheus.MustNewConstMetric(descRole, prometheus.GaugeValue, b2f(s.agent.Load()), "agent")
	ch <- prometheus.MustNewConstMetric(descRole, prometheus.GaugeValue, b2f(s.coordinator.Load()), "coordinator")
	ch <- prometheus.MustNewConstMetric(descTableKeys, prometheus.GaugeValue, float64(s.tableKeys.Load()))
	if f := s.fetched.Load(); f != 0 {
		ch <- prometheus.MustNewConstMetric(descTableAge, prometheus.GaugeValue, since(f))
	}
	if s.agent.Load() {
		if r := s.replied.Load(); r != 0 {
			ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, since(r))
		}
		end := s.leaseEnd.Load()
		ch <- prometheus.MustNewConstMetric(descLease, prometheus.GaugeValue, max(time.Duration(end-now).Seconds(), -1e9))
		ch <- prometheus.MustNewConstMetric(descCutOff, prometheus.GaugeValue, b2f(end <= now))
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, f64(s.held.Load()))
		ch <- prometheus.MustNewConstMetric(descDemand, prometheus.GaugeValue, f64(s.demand.Load()))
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(s.refused.Load()))
	}
	ch <- prometheus.MustNewConstMetric(descGrants, prometheus.CounterValue, float64(s.grants.Load()))
	ch <- prometheus.MustNewConstMetric(descSteps, prometheus.CounterValue, float64(s.steps.Load()))
	ch <- prometheus.MustNewConstMetric(descStepErrors, prometheus.CounterValue, float64(s.failures.Load()))
	ch <- prometheus.MustNewConstMetric(descLate, prometheus.CounterValue, float64(s.late.Load()))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func f64(bits uint64) float64 { return math.Float64frombits(bits) }
