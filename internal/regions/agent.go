package regions

import (
	"math"
	"slices"
	"time"
)

// AgentConfig is how a region's agent talks to the coordinator and publishes to its replicas.
type AgentConfig struct {
	Region string
	Policy Policy
	// TableLease is how long a replica applies a table after it began fetching it; after that
	// it fetches again before deciding a global key.
	TableLease time.Duration
	// Margin covers the replicas' clocks running slower than the agent's.
	Margin time.Duration
	// MaxKeys bounds the keys the agent reports and holds (0: DefaultMaxKeys). A key asked for
	// beyond it is not reported: it gets no share, and its requests are denied, until the
	// agent forgets others.
	MaxKeys int
}

// DefaultMaxKeys is AgentConfig.MaxKeys's default: a report naming every key is then at most
// about 9 MB, and the coordinator's state for the region about 20 MB.
const DefaultMaxKeys = 100_000

// Published is the region's table of shares as the agent publishes it to the region's
// replicas: every key's share, and until when (on the agent's clock) the shares apply; past
// that, each key's safe share applies.
type Published struct {
	Shares     map[string]Share
	Versions   map[string]uint64
	ValidUntil int64
}

// Change is one key's share to publish. A Change whose burst grows needs Charge requests
// charged to the key in the region's store before it is published: the share in force
// then has no more tokens than before it (see Agent.Receive).
type Change struct {
	Key     string
	Version uint64
	Limit   Share
	From    Share
	To      Share
	Charge  int64
}

// noLease is the lease's end before any reply: a time before any clock's reading (clocks may
// read below zero), with room below it for arithmetic.
const noLease = math.MinInt64 / 4

type publication struct {
	at         int64
	validUntil int64
	shares     map[string]Share
	// inherited: the table an earlier agent published, whose end is known only as an upper
	// bound (validUntil).
	inherited bool
}

type agentKey struct {
	limit   Share
	demand  int64
	applied Share
	version uint64
	// sent is the demand last reported (-1: none yet), in report sentSeq; confirmed once the
	// reply to that report came.
	sent      int64
	sentSeq   uint64
	confirmed bool
	// owed: the coordinator's last reply carried grants of the key, so it waits for an ack.
	owed bool
	// waits are the versions published and not yet acknowledgeable: (version, when).
	waits []wait
	acked uint64
}

type wait struct {
	version uint64
	at      int64
}

// Agent is a region's side of the protocol: it reports the region's demand, takes the
// coordinator's grants, and says which versions its replicas apply. It is a state machine: the
// caller feeds it the time (its own clock, nanoseconds), sends its reports, applies its
// changes to the region's store and replicas, and tells it when they are published. It is not
// safe for concurrent use.
type Agent struct {
	cfg      AgentConfig
	seq      uint64
	sent     map[uint64]int64 // report seq → when sent
	leaseEnd int64
	// inherited is, for an agent that continues an earlier one's table, the latest that agent's
	// lease may end (on this agent's clock).
	inherited int64
	// lapsed: the lease ended (or was never had) and every applied share fell to its safe share.
	lapsed bool
	epoch  uint64 // the coordinator's epoch of the newest reply taken
	gen    uint64 // the newest reply taken (Reply.Gen)
	// claimSeq is the first report that claimed the region's shares after a new epoch began:
	// a reply to an earlier report renews no lease (the new coordinator did not count those
	// shares). Every report claims until a reply to one of them comes.
	claimSeq uint64
	claiming bool
	keys     map[string]*agentKey
	pubs     []publication // recent publications, oldest first
	// leaving: the agent applies no grant any more; leftAt is when its zero table has been
	// published long enough that no replica applies a share (0: not yet).
	leaving bool
	leftAt  int64
	// Refused counts the keys not reported because MaxKeys were known.
	Refused uint64
}

// NewAgent returns an agent that continues from the table last published (nil: nothing), with
// reports numbered from seqBase+1. seqBase must be above every seq an earlier agent of the
// region used (the region's store hands out bases). last.ValidUntil is on this agent's clock,
// and must not be earlier than the table's end (an upper bound will do).
func NewAgent(cfg AgentConfig, last *Published, seqBase uint64) *Agent {
	a := &Agent{cfg: cfg, seq: seqBase, sent: map[uint64]int64{}, keys: map[string]*agentKey{}, leaseEnd: noLease,
		inherited: noLease}
	if last != nil {
		shares := map[string]Share{}
		for k, s := range last.Shares {
			a.keys[k] = &agentKey{applied: s, version: last.Versions[k], sent: -1}
			shares[k] = s
		}
		// The replicas may apply that table until it ends (then its safe shares), and the
		// earlier agent's lease ended at most a margin after the table.
		a.pubs = []publication{{at: -1 << 62, validUntil: last.ValidUntil, shares: shares, inherited: true}}
		a.inherited = last.ValidUntil + int64(cfg.Margin)
	}
	return a
}

// lapse, once the lease has ended (and any lease of an earlier agent whose table this one
// continues), makes every applied share its safe share, as the replicas apply it by then, and
// the reports claim what the region may apply until a reply renews the lease: the coordinator
// may have counted less for the region since (its lease ended there too, or the state was
// lost).
func (a *Agent) lapse(now int64) {
	if a.lapsed || now < max(a.leaseEnd, a.inherited) {
		return
	}
	a.lapsed = true
	for _, k := range a.keys {
		k.applied = a.cfg.Policy.share(k.applied, k.limit)
	}
	if !a.claiming {
		a.claiming, a.claimSeq = true, a.seq+1
	}
}

// Observe sets key's demand (requests per period over the last Δ) and its limit as the rules
// say.
func (a *Agent) Observe(key string, limit Share, demand int64) {
	k := a.keys[key]
	if k == nil && len(a.keys) >= a.maxKeys() {
		a.Refused++
		return
	}
	if k == nil {
		k = &agentKey{sent: -1}
		a.keys[key] = k
	}
	k.limit, k.demand = limit, demand
}

// Report returns the report to send at now: every key whose demand changed by more than a
// sixteenth, started or stopped, or whose acknowledgement moved.
func (a *Agent) Report(now int64) Report {
	a.lapse(now)
	a.seq++
	a.sent[a.seq] = now
	for s, at := range a.sent {
		if now-at > int64(a.cfg.TableLease)*4+int64(time.Hour) {
			delete(a.sent, s)
		}
	}
	// Claims go in every report until a reply to one of them comes.
	claim := a.claiming
	r := Report{Region: a.cfg.Region, Seq: a.seq, Policy: a.cfg.Policy, Claimed: claim, Epoch: a.epoch}
	for _, key := range sortedKeys(a.keys) {
		k := a.keys[key]
		if k.demand == 0 && k.sent == 0 && k.confirmed && !k.owed && k.applied == (Share{}) && len(k.waits) == 0 {
			delete(a.keys, key) // nothing asked, nothing held, nothing owed: forgotten
			continue
		}
		acked := k.acked
		for len(k.waits) > 0 && k.waits[0].at <= now {
			acked = k.waits[0].version
			k.waits = k.waits[1:]
		}
		changed := k.sent < 0 || (k.demand == 0) != (k.sent == 0) || abs(k.demand-k.sent)*16 > k.sent ||
			(!k.confirmed && a.seq > k.sentSeq+3)
		claimed := claim && k.version > 0
		if !changed && !k.owed && acked == k.acked && !claimed {
			continue
		}
		d := int64(-1)
		if changed || claimed {
			d, k.sent, k.sentSeq, k.confirmed = k.demand, k.demand, a.seq, false
		}
		k.acked = acked
		kr := KeyReport{Key: key, Limit: k.limit, Demand: d, Acked: acked}
		if claimed {
			most := a.most(key, k.applied, now)
			kr.Claim, kr.ClaimVersion = &most, k.version
		}
		r.Keys = append(r.Keys, kr)
	}
	return r
}

// Each calls f with every key the agent knows: the share applied and the demand observed.
func (a *Agent) Each(f func(key string, applied Share, demand int64)) {
	for key, k := range a.keys {
		f(key, k.applied, k.demand)
	}
}

func (a *Agent) maxKeys() int {
	if a.cfg.MaxKeys > 0 {
		return a.cfg.MaxKeys
	}
	return DefaultMaxKeys
}

// Has reports whether the agent knows key (asked for, held or owed).
func (a *Agent) Has(key string) bool { return a.keys[key] != nil }

// LeaseEnd is when the region's lease ends, on the agent's clock.
func (a *Agent) LeaseEnd() int64 { return a.leaseEnd }

// Receive takes a reply at now and returns the changes to publish, in key order. The lease it
// carries starts at the report's sending: earlier than the coordinator's receipt of it.
func (a *Agent) Receive(now int64, r Reply) []Change {
	a.lapse(now)
	sent, ok := a.sent[r.Seq]
	if !ok || a.leaving || r.Epoch < a.epoch || (r.Epoch == a.epoch && r.Gen <= a.gen) {
		// A reply to a report of an earlier run (or forgotten), or older than one taken:
		// take nothing of it.
		return nil
	}
	if r.Epoch > a.epoch {
		// A coordinator's state this agent has not heard from (the state was lost, or the
		// agent is new): claim what the region may apply; the claim's reply renews the lease.
		// (Claims made before count for nothing in it: claim again, from the next report.)
		a.claiming, a.claimSeq = true, a.seq+1
		a.epoch = r.Epoch
	}
	a.gen = r.Gen
	var out []Change
	// The reply says which keys the coordinator waits on: only those.
	granted := make(map[string]bool, len(r.Grants))
	for _, g := range r.Grants {
		granted[g.Key] = true
	}
	for key, k := range a.keys {
		k.owed = granted[key]
		if k.sentSeq == r.Seq {
			k.confirmed = true
		}
	}
	latest := map[string]Grant{}
	for _, g := range r.Grants {
		if k := a.keys[g.Key]; k != nil && g.Version <= k.version {
			continue
		}
		if g.Version > latest[g.Key].Version {
			latest[g.Key] = g
		}
	}
	for _, key := range sortedKeys(latest) {
		g := latest[key]
		k := a.keys[key]
		if k == nil {
			k = &agentKey{sent: -1, owed: true}
			a.keys[key] = k
		}
		c := Change{Key: key, Version: g.Version, Limit: k.limit, From: k.applied, To: g.Share}
		if ref := a.least(key, now); g.Share.Burst > ref {
			c.Charge = g.Share.Burst - ref
		}
		k.applied, k.version = g.Share, g.Version
		out = append(out, c)
	}
	if r.Seq >= a.claimSeq {
		a.claiming = false
		a.leaseEnd = max(a.leaseEnd, sent+int64(r.Lease))
		if a.leaseEnd > now {
			a.lapsed = false
		}
	}
	return out
}

// least is the smallest burst of key a replica of the region may be applying at now: of the
// tables published within a table lease (and the one before them), each key's share, or its
// safe share once that table has ended.
func (a *Agent) least(key string, now int64) int64 {
	ref := int64(-1)
	from := now - int64(a.cfg.TableLease+a.cfg.Margin)
	for i := len(a.pubs) - 1; i >= 0; i-- {
		p := a.pubs[i]
		s := p.shares[key]
		if p.validUntil <= now || p.inherited {
			lim := a.limitOf(key)
			s = s.min(a.cfg.Policy.share(s, lim))
		}
		if ref < 0 || s.Burst < ref {
			ref = s.Burst
		}
		if p.at < from {
			break
		}
	}
	return max(ref, 0)
}

// most is the largest share of key a replica of the region may apply at now or later without a
// new grant: applied, or that of a table published within a table lease (and the one before
// them), or its safe share once that table has ended.
func (a *Agent) most(key string, applied Share, now int64) Share {
	most := applied
	from := now - int64(a.cfg.TableLease+a.cfg.Margin)
	for i := len(a.pubs) - 1; i >= 0; i-- {
		p := a.pubs[i]
		s := p.shares[key]
		if p.validUntil <= now {
			s = s.min(a.cfg.Policy.share(s, a.limitOf(key)))
		}
		most = most.max(s)
		if p.at < from {
			break
		}
	}
	return most
}

func (a *Agent) limitOf(key string) Share {
	if k := a.keys[key]; k != nil {
		return k.limit
	}
	return Share{}
}

// Table returns the table to publish: every key's applied share, valid until the lease's end
// less the margin (the replicas' clocks may run slower than the agent's), so that every
// replica has stopped applying it by the lease's end. The publisher must express ValidUntil
// on the store's clock without moving it later (see the store's clock sync).
func (a *Agent) Table() Published {
	p := Published{Shares: map[string]Share{}, Versions: map[string]uint64{},
		ValidUntil: a.leaseEnd - int64(a.cfg.Margin)}
	for key, k := range a.keys {
		if k.version > 0 {
			p.Shares[key], p.Versions[key] = k.applied, k.version
		}
	}
	return p
}

// Published records that table p was published at now (the write confirmed): the versions it
// carries can be acknowledged once every replica has fetched it.
func (a *Agent) Published(now int64, p Published) {
	a.pubs = append(a.pubs, publication{at: now, validUntil: p.ValidUntil, shares: p.Shares})
	from := now - int64(a.cfg.TableLease+a.cfg.Margin)
	i := 0
	for i+1 < len(a.pubs) && a.pubs[i+1].at < from {
		i++
	}
	a.pubs = slices.Delete(a.pubs, 0, i)
	at := now + int64(a.cfg.TableLease+a.cfg.Margin)
	if a.leaving && a.leftAt == 0 {
		a.leftAt = at
	}
	for key, v := range p.Versions {
		k := a.keys[key]
		if k == nil || v <= k.acked {
			continue
		}
		if n := len(k.waits); n == 0 || k.waits[n-1].version < v {
			k.waits = append(k.waits, wait{version: v, at: at})
		}
	}
}

// Leave makes every share of the region zero and the agent take no grant any more: publish
// Table, then send LeaveReport once it says so.
func (a *Agent) Leave() {
	a.leaving = true
	for _, k := range a.keys {
		k.applied = Share{}
	}
}

// LeaveReport returns the report that says the region has left, once no replica of it applies
// a share any more; until then, ok is false.
func (a *Agent) LeaveReport(now int64) (r Report, ok bool) {
	if !a.leaving || a.leftAt == 0 || now < a.leftAt {
		return Report{}, false
	}
	a.seq++
	return Report{Region: a.cfg.Region, Seq: a.seq, Policy: a.cfg.Policy, Leave: true}, true
}
