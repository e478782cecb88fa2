package regions

import (
	"container/heap"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var (
	simSteps = flag.Int("regions.steps", 30_000, "steps of each seed of TestSimulation")
	simSeeds = flag.Int("regions.seeds", 5, "seeds of TestSimulation")
)

// TestSimulation runs the coordination protocol's real parts (Coordinator, Agent, View) on a
// virtual clock, with random delays, lost and reordered messages, partitions, clocks that
// drift within the margin, coordinator fail-over, agents that restart, replicas that pause,
// and regions that join and leave, and checks at every step that the shares the replicas may
// apply sum to at most the limit. Longer: go test -run TestSimulation -regions.steps=1000000.
func TestSimulation(t *testing.T) {
	for seed := range uint64(*simSeeds) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			s := newSim(t, seed)
			s.run(*simSteps)
			t.Logf("%d steps, %s simulated: %s", *simSteps, time.Duration(s.now), s.stats)
		})
	}
}

type simEvent struct {
	at  int64
	seq uint64
	fn  func()
}

type eventQueue []simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// clock is a party's clock: it reads off + real·(1+rho).
type clock struct {
	off int64
	rho float64
}

func (c clock) at(real int64) int64 { return c.off + real + int64(float64(real)*c.rho) }

type simKey struct {
	name string
	lim  Share
}

type simReplica struct {
	clk    clock
	view   *View
	paused int64 // until when it fetches nothing
}

type simRegion struct {
	name     string
	clk      clock // the agent's
	storeClk clock // the region's store's
	agent    *Agent
	life     int  // incarnation of the agent: events of an earlier one do nothing
	up       bool // the agent runs
	member   bool // the region takes part (false: left, or not joined yet)
	leaving  bool
	cutUntil int64
	pub      Published // in the region's store, ValidUntil on its clock
	pubSeq   uint64    // publications begun
	written  uint64    // the publication in the store
	seqBase  uint64    // the store's counter of agents' report bases
	replicas []*simReplica
	demand   map[string]int64
}

type simCoord struct {
	c     *Coordinator
	alive bool
}

type simStats struct {
	steps, reports, replies, lost, publishes, failovers, restarts, partitions, leaves, losses int
	// util sums, over checks with demand, the part of the rate the regions with demand may apply.
	util  float64
	utilN int
}

func (s simStats) String() string {
	u := 0.0
	if s.utilN > 0 {
		u = s.util / float64(s.utilN)
	}
	return fmt.Sprintf("%d reports, %d replies, %d lost, %d publications, %d fail-overs, %d agent restarts, "+
		"%d partitions, %d leaves, %d losses of the store's data; rate applied where wanted: %.3f of the limit on average",
		s.reports, s.replies, s.lost, s.publishes, s.failovers, s.restarts, s.partitions, s.leaves, s.losses, u)
}

type sim struct {
	t                     *testing.T
	rng                   *rand.Rand
	now                   int64
	q                     eventQueue
	seq                   uint64
	ccfg                  CoordinatorConfig
	tlease, margin, delta time.Duration
	rho                   float64
	loss                  float64
	keys                  []simKey
	inbox                 []Report
	state                 []byte // the coordinator's state in the store
	coord                 [2]*simCoord
	gclk                  clock // the coordination store's: every coordinator reads its time there
	lead                  int   // the coordinator holding the store's lease; -1 while none
	regs                  []*simRegion
	stats                 simStats
	lossy                 bool // the coordination store loses its data now and then (safe share zero only)
}

func newSim(t *testing.T, seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	s := &sim{
		t: t, rng: rng,
		ccfg:   CoordinatorConfig{Lease: 2 * time.Second, Margin: 60 * time.Millisecond},
		tlease: []time.Duration{300 * time.Millisecond, 2 * time.Second}[rng.IntN(2)],
		margin: 20 * time.Millisecond,
		delta:  []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, time.Second}[rng.IntN(3)],
		rho:    0.002, loss: 0.05,
		keys: []simKey{{"a", Share{100, 20}}, {"b", Share{7, 3}}, {"c", Share{1, 1}}, {"d", Share{100000, 5000}}},
	}
	for i := range s.coord {
		s.coord[i] = &simCoord{alive: true}
	}
	s.gclk = s.clock()
	s.coord[0].c = NewCoordinator(s.ccfg, nil)
	s.lead = 0
	policies := []Policy{{Safe: SafeZero}, {Safe: SafeFair, Regions: 4}, {Safe: SafeLast}}
	if s.lossy = seed%2 == 1; s.lossy {
		policies = policies[:1]
		if seed%4 == 3 {
			s.ccfg.Regions = 4 // a recovery ends once every region has claimed
		}
	}
	for i := range 4 {
		r := &simRegion{name: fmt.Sprintf("r%d", i), clk: s.clock(), storeClk: s.clock(), demand: map[string]int64{}}
		for range 2 {
			r.replicas = append(r.replicas, &simReplica{clk: s.clock()})
		}
		s.regs = append(s.regs, r)
		pol := policies[rng.IntN(len(policies))]
		if i < 3 {
			s.start(r, pol)
		} else {
			s.after(time.Duration(rng.Int64N(int64(20*time.Second))), func() { s.start(r, pol) })
		}
		for j := range r.replicas {
			s.fetch(r, r.replicas[j])
		}
	}
	for _, r := range s.regs {
		s.demands(r)
	}
	s.coordTick()
	s.chaos()
	return s
}

func (s *sim) clock() clock {
	return clock{off: s.rng.Int64N(int64(time.Hour)) - int64(30*time.Minute), rho: (s.rng.Float64()*2 - 1) * s.rho}
}

func (s *sim) after(d time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.q, simEvent{at: s.now + int64(max(d, 1)), seq: s.seq, fn: fn})
}

func (s *sim) run(steps int) {
	for s.stats.steps = 0; s.stats.steps < steps && s.q.Len() > 0; s.stats.steps++ {
		e := heap.Pop(&s.q).(simEvent)
		s.now = e.at
		e.fn()
		s.check()
		if s.t.Failed() {
			return
		}
	}
}

// wan is a one-way delay between a region and the coordination store: 25–75 ms with jitter,
// now and then far longer (so messages reorder).
func (s *sim) wan() time.Duration {
	d := 25*time.Millisecond + time.Duration(s.rng.Int64N(int64(50*time.Millisecond)))
	if s.rng.IntN(50) == 0 {
		d += time.Duration(s.rng.Int64N(int64(3 * time.Second)))
	}
	return d
}

// lan is a one-way delay between a region's processes and its store.
func (s *sim) lan() time.Duration {
	return 200*time.Microsecond + time.Duration(s.rng.Int64N(int64(3*time.Millisecond)))
}

func (s *sim) lost(r *simRegion) bool {
	if s.now < r.cutUntil || s.rng.Float64() < s.loss {
		s.stats.lost++
		return true
	}
	return false
}

func (s *sim) start(r *simRegion, pol Policy) {
	r.life++
	r.up, r.member, r.leaving = true, true, false
	var last *Published
	if r.pub.Shares != nil {
		// The table's end on the agent's clock, as the runtime gets it: from a reading of the
		// store's clock, bracketed by the agent's (an upper bound: the reading's end).
		p := r.pub
		p.ValidUntil = r.pub.ValidUntil - r.storeClk.at(s.now) + r.clk.at(s.now+int64(s.lan()))
		last = &p
	}
	r.seqBase += 1 << 32
	r.agent = NewAgent(AgentConfig{Region: r.name, Policy: pol, TableLease: s.tlease, Margin: s.margin}, last,
		r.seqBase)
	life := r.life
	var tick func()
	tick = func() {
		if r.life != life || !r.up {
			return
		}
		s.agentTick(r)
		s.after(s.delta+time.Duration(s.rng.Int64N(int64(s.delta/5))), tick)
	}
	s.after(time.Duration(s.rng.Int64N(int64(s.delta))), tick)
}

func (s *sim) agentTick(r *simRegion) {
	local := r.clk.at(s.now)
	if !r.leaving {
		for _, k := range s.keys {
			r.agent.Observe(k.name, k.lim, r.demand[k.name])
		}
	}
	rep := r.agent.Report(local)
	if r.leaving {
		if lr, ok := r.agent.LeaveReport(local); ok {
			rep = lr
		}
	}
	s.stats.reports++
	if s.lost(r) {
		return
	}
	s.after(s.wan(), func() { s.inbox = append(s.inbox, rep) })
}

func (s *sim) coordTick() {
	defer s.after(s.delta/3, s.coordTick)
	if s.lead < 0 {
		return
	}
	c := s.coord[s.lead]
	now := s.gclk.at(s.now)
	for _, rep := range s.inbox {
		c.c.Receive(now, rep)
	}
	s.inbox = nil
	replies := c.c.Step(now)
	b, err := json.Marshal(c.c.State())
	if err != nil {
		s.t.Fatal(err)
	}
	s.state = b
	for _, rep := range replies {
		s.stats.replies++
		r := s.region(rep.Region)
		if s.lost(r) {
			continue
		}
		life := r.life
		s.after(s.wan(), func() {
			if r.life == life && r.up {
				s.receive(r, rep)
			}
		})
	}
}

func (s *sim) region(name string) *simRegion {
	for _, r := range s.regs {
		if r.name == name {
			return r
		}
	}
	s.t.Fatalf("no region %s", name)
	return nil
}

func (s *sim) receive(r *simRegion, rep Reply) {
	a := r.clk.at(s.now)
	r.agent.Receive(a, rep)
	pub := r.agent.Table()
	life := r.life
	// Publish: the write lands in the region's store after a LAN delay, and is confirmed after
	// another; the store's time read with it expresses ValidUntil on the store's clock without
	// moving it later.
	d1, d2 := s.lan(), s.lan()
	s.pubSeq(r, pub, a, d1, d2, life)
}

// pubSeq publishes pub, taken from the agent at a on its clock: first the store's time is read
// (a round trip), which expresses ValidUntil on the store's clock without moving it later; then
// the write lands after a LAN delay (the store keeps the newest publication only) and is
// confirmed after another.
func (s *sim) pubSeq(r *simRegion, pub Published, a int64, d1, d2 time.Duration, life int) {
	r.pubSeq++
	seq := r.pubSeq
	var storeNow int64
	s.after(d1, func() { storeNow = r.storeClk.at(s.now) })
	s.after(d1+d2, func() {
		b := r.clk.at(s.now)
		p := pub
		p.ValidUntil = pub.ValidUntil + storeNow - b
		s.after(s.lan(), func() {
			// The store takes the newest publication of the agent holding the role only (the
			// publish script is fenced by the role's token).
			if seq > r.written && r.life == life && r.up {
				r.written, r.pub = seq, p
			}
			s.after(s.lan(), func() {
				if r.life == life {
					s.stats.publishes++
					r.agent.Published(r.clk.at(s.now), pub)
				}
			})
		})
	})
}

func (s *sim) fetch(r *simRegion, rp *simReplica) {
	if s.now < rp.paused {
		s.after(time.Duration(rp.paused-s.now), func() { s.fetch(r, rp) })
		return
	}
	f := rp.clk.at(s.now)
	s.after(s.lan(), func() {
		pub, storeNow := r.pub, r.storeClk.at(s.now)
		s.after(s.lan(), func() {
			if pub.Shares != nil {
				rp.view = NewView(pub, storeNow, f, s.tlease, r.agent.cfg.Policy)
			}
		})
	})
	s.after(s.tlease/3+time.Duration(s.rng.Int64N(int64(s.tlease/10))), func() { s.fetch(r, rp) })
}

func (s *sim) demands(r *simRegion) {
	for _, k := range s.keys {
		switch s.rng.IntN(5) {
		case 0:
			r.demand[k.name] = 0
		case 1:
			r.demand[k.name] = k.lim.Rate / 10
		case 2:
			r.demand[k.name] = k.lim.Rate / 3
		default:
			r.demand[k.name] = k.lim.Rate * int64(1+s.rng.IntN(3))
		}
	}
	s.after(time.Duration(s.rng.Int64N(int64(4*s.delta))), func() { s.demands(r) })
}

// chaos schedules the faults: partitions shorter than a lease, about a lease and much longer;
// coordinator fail-over; agent restarts; replicas pausing; regions leaving and coming back.
func (s *sim) chaos() {
	defer s.after(time.Duration(s.rng.Int64N(int64(3*time.Second))), s.chaos)
	r := s.regs[s.rng.IntN(len(s.regs))]
	switch s.rng.IntN(7) {
	case 6:
		// The coordination store restarts empty: the state, the inbox and the role are lost.
		// (Under safe shares fair and last, a region cut off for the whole recovery keeps a
		// share the new state does not count: only zero keeps the bound through a loss.)
		if !s.lossy {
			return
		}
		s.stats.losses++
		s.inbox, s.state = nil, nil
		if s.lead >= 0 {
			s.coord[s.lead].c = NewCoordinator(s.ccfg, nil)
		}
	case 0:
		s.stats.partitions++
		lengths := []time.Duration{s.ccfg.Lease / 3, s.ccfg.Lease, 5 * s.ccfg.Lease}
		r.cutUntil = s.now + int64(lengths[s.rng.IntN(3)])
	case 1:
		if s.lead < 0 {
			return
		}
		s.stats.failovers++
		old := s.lead
		s.coord[old].alive = false
		s.lead = -1
		s.after(time.Duration(s.rng.Int64N(int64(2*time.Second))), func() {
			next := 1 - old
			var st *State
			if s.state != nil {
				st = &State{}
				if err := json.Unmarshal(s.state, st); err != nil {
					s.t.Fatal(err)
				}
			}
			s.coord[next].c = NewCoordinator(s.ccfg, st)
			s.coord[next].alive = true
			s.lead = next
		})
	case 2:
		if !r.up || !r.member {
			return
		}
		s.stats.restarts++
		r.up = false
		pol := r.agent.cfg.Policy
		s.after(time.Duration(s.rng.Int64N(int64(3*time.Second))), func() { s.start(r, pol) })
	case 3:
		// A paused replica keeps its view and its clock runs on; it is checked at every step
		// as if it decided then.
		rp := r.replicas[s.rng.IntN(len(r.replicas))]
		rp.paused = s.now + s.rng.Int64N(int64(3*s.ccfg.Lease))
	case 4:
		if !r.up || !r.member || r.leaving {
			return
		}
		s.stats.leaves++
		r.leaving = true
		r.agent.Leave()
		a := r.clk.at(s.now)
		s.pubSeq(r, r.agent.Table(), a, s.lan(), s.lan(), r.life)
		pol := r.agent.cfg.Policy
		s.after(time.Duration(s.rng.Int64N(int64(20*time.Second))), func() {
			if r.leaving {
				s.start(r, pol)
			}
		})
	default:
		s.demands(r)
	}
}

// check asserts that, for every key, the shares the replicas may apply now sum to at most the
// limit: each region counts the largest share any of its replicas may apply.
func (s *sim) check() {
	for _, k := range s.keys {
		var sum Share
		for _, r := range s.regs {
			var most Share
			for _, rp := range r.replicas {
				local := rp.clk.at(s.now)
				if rp.view.Stale(local) {
					continue
				}
				most = most.max(rp.view.Share(k.name, k.lim, local))
			}
			sum = sum.add(most)
		}
		if !sum.within(k.lim) {
			s.dump(k.name)
			s.t.Fatalf("step %d at %s: key %s: the regions may apply %s, above its limit %s",
				s.stats.steps, time.Duration(s.now), k.name, sum, k.lim)
		}
		want := false
		for _, r := range s.regs {
			want = want || (r.demand[k.name] > 0 && r.member && !r.leaving)
		}
		if want {
			s.stats.util += float64(sum.Rate) / float64(k.lim.Rate)
			s.stats.utilN++
		}
	}
}

func (s *sim) dump(key string) {
	for _, r := range s.regs {
		if r.agent == nil {
			continue
		}
		s.t.Logf("region %s: up %v member %v leaving %v cut %v lease end (agent clock) %d now %d policy %v",
			r.name, r.up, r.member, r.leaving, s.now < r.cutUntil, r.agent.leaseEnd, r.clk.at(s.now), r.agent.cfg.Policy)
		if k := r.agent.keys[key]; k != nil {
			s.t.Logf("  agent: applied %s v%d acked %d waits %v", k.applied, k.version, k.acked, k.waits)
		}
		for i, rp := range r.replicas {
			if rp.view == nil {
				continue
			}
			local := rp.clk.at(s.now)
			s.t.Logf("  replica %d: stale %v v%d share %s until-now %s fetched-now %s", i, rp.view.Stale(local),
				rp.view.Version(key), rp.view.pub.Shares[key], time.Duration(rp.view.until-local),
				time.Duration(rp.view.fetched-local))
		}
	}
	if s.lead >= 0 {
		c := s.coord[s.lead].c
		if ks := c.st.Keys[key]; ks != nil {
			for name, h := range ks.Regions {
				rs := c.st.Regions[name]
				s.t.Logf("coordinator: %s held %s acked v%d %s issued %v lapsed %v left %v", name, h.held(), h.Acked,
					h.AckedShare, h.Issued, rs.Lapsed, rs.Left)
			}
		}
	}
}
