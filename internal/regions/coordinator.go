package regions

import (
	"slices"
	"time"
)

// CoordinatorConfig is how the coordinator grants shares.
type CoordinatorConfig struct {
	// Lease is how long a region may apply its shares after the report a reply answers.
	Lease time.Duration
	// Margin is added to a lease on the coordinator's side before a region's shares are given
	// to others: it covers the regions' clocks running faster than the coordinator's (a region
	// measures its lease on its own clock). Offsets between clocks do not matter.
	Margin time.Duration
	// Regions, when above 0, is the number of regions: a new state's recovery ends as soon as
	// that many have claimed what they hold, rather than a lease after it began.
	Regions int
	// IdleAfter is how long a key nobody asks for keeps its shares (default DefaultIdleAfter).
	IdleAfter time.Duration
}

// DefaultIdleAfter is CoordinatorConfig.IdleAfter's default.
const DefaultIdleAfter = 2 * time.Minute

func (c *Coordinator) idleAfter() time.Duration {
	if c.cfg.IdleAfter > 0 {
		return c.cfg.IdleAfter
	}
	return DefaultIdleAfter
}

// State is everything the coordinator knows; it is kept in the coordination store so that
// another process can take over where one left off. Times are the coordinator's clock, in
// nanoseconds.
type State struct {
	Regions map[string]*RegionState `json:"regions"`
	Keys    map[string]*KeyState    `json:"keys"`
	// Version is the last version granted, of any key: versions only grow, also across keys
	// forgotten and granted again.
	Version uint64 `json:"version"`
	// Gen is the last reply's number (Reply.Gen).
	Gen uint64 `json:"gen"`
	// Born is when this state began, which names its epoch. Until Born plus a lease and the
	// margin, no share grows: regions may still apply shares an earlier (lost) state granted,
	// which they claim in their reports, and a region that does not claim has seen its lease
	// end by then.
	Born  int64 `json:"born"`
	Begun bool  `json:"begun"`
}

// RegionState is what the coordinator knows of one region.
type RegionState struct {
	Policy Policy `json:"policy"`
	// LeaseEnd is when the region's lease ends: the receipt of its last report plus the lease.
	LeaseEnd int64  `json:"lease_end"`
	LastSeq  uint64 `json:"seq"`
	// Lapsed: the lease ended (plus the margin) and the region's shares were cut to its safe
	// share; it is back when it reports again.
	Lapsed bool `json:"lapsed,omitempty"`
	// Left: the region said it applies no share any more.
	Left bool `json:"left,omitempty"`
	// Answer is the last report not answered yet (0: none).
	Answer uint64 `json:"answer,omitempty"`
	// Claimed: the region claimed what it holds in this state's epoch.
	Claimed bool `json:"claimed,omitempty"`
}

// KeyState is one global key's shares, by region.
type KeyState struct {
	Regions map[string]*Held `json:"regions"`
	// Idle is since when no region has asked for the key (0: one does).
	Idle int64 `json:"idle,omitempty"`
}

// Held is what one region holds of one key, as the coordinator counts it.
type Held struct {
	Limit  Share `json:"l"`
	Demand int64 `json:"d"`
	// Acked is the last version the region applies alone, AckedShare that version's share.
	Acked      uint64 `json:"a"`
	AckedShare Share  `json:"as"`
	// Issued are the grants sent after Acked, oldest first: the region may apply any of them.
	Issued []Grant `json:"i,omitempty"`
}

// held is the most h's region may apply: the largest of every share it may be using.
func (h *Held) held() Share {
	s := h.AckedShare
	for _, g := range h.Issued {
		s = s.max(g.Share)
	}
	return s
}

// latest is the share last granted.
func (h *Held) latest() Share {
	if n := len(h.Issued); n > 0 {
		return h.Issued[n-1].Share
	}
	return h.AckedShare
}

func (h *Held) issue(st *State, key string, s Share) Grant {
	st.Version++
	g := Grant{Key: key, Version: st.Version, Share: s}
	h.Issued = append(h.Issued, g)
	return g
}

func (h *Held) ack(v uint64) {
	if v <= h.Acked {
		return
	}
	i := slices.IndexFunc(h.Issued, func(g Grant) bool { return g.Version == v })
	if i < 0 {
		return // not a version this state issued (cut since, by a lapse): ignore
	}
	h.Acked, h.AckedShare = v, h.Issued[i].Share
	h.Issued = slices.Delete(h.Issued, 0, i+1)
}

// Coordinator divides each global key's limit among the regions that use it, by their demand,
// so that the shares the regions may apply never sum to more than the limit: a share that
// shrinks is counted at its old size until the region acknowledges the cut or its lease ends,
// and only then is the difference granted to others. It is a state machine: the caller feeds it
// reports and the time, and sends the replies it returns. It is not safe for concurrent use.
type Coordinator struct {
	cfg CoordinatorConfig
	st  State
	// dirty are the keys changed since TakeDirty, to be written to the store.
	dirty map[string]bool
	// Granted counts the grants this coordinator made.
	Granted uint64
}

// issue grants key's share s to h's region.
func (c *Coordinator) issue(h *Held, key string, s Share) Grant {
	c.Granted++
	return h.issue(&c.st, key, s)
}

// NewCoordinator returns a coordinator that continues from st (nil: from nothing).
func NewCoordinator(cfg CoordinatorConfig, st *State) *Coordinator {
	c := &Coordinator{cfg: cfg, dirty: map[string]bool{}}
	if st != nil {
		c.st = *st
	}
	if c.st.Regions == nil {
		c.st.Regions = map[string]*RegionState{}
	}
	if c.st.Keys == nil {
		c.st.Keys = map[string]*KeyState{}
	}
	return c
}

// State returns the coordinator's state, to be stored (it is c's own: do not modify it).
func (c *Coordinator) State() *State { return &c.st }

// begin starts a new epoch at now, when the state is new: versions and replies are numbered
// from now in nanoseconds, above every number an earlier epoch used (each used fewer than one a
// nanosecond).
func (c *Coordinator) begin(now int64) {
	if c.st.Begun {
		return
	}
	c.st.Begun, c.st.Born = true, now
	c.st.Version = max(c.st.Version, epochOf(now))
	c.st.Gen = max(c.st.Gen, epochOf(now))
}

// epochOf maps an instant (which may read below zero) to an epoch, keeping the order.
func epochOf(t int64) uint64 { return uint64(t) ^ 1<<63 }

// recovering reports whether, at now, shares granted by a lost state may still apply unclaimed:
// until a lease and the margin after the state began, or until every region has claimed.
func (c *Coordinator) recovering(now int64) bool {
	if now >= c.st.Born+int64(c.cfg.Lease+c.cfg.Margin) {
		return false
	}
	if c.cfg.Regions <= 0 {
		return true
	}
	claimed := 0
	for _, rs := range c.st.Regions {
		if rs.Claimed {
			claimed++
		}
	}
	return claimed < c.cfg.Regions
}

// Receive takes a region's report, received at now.
func (c *Coordinator) Receive(now int64, r Report) {
	c.begin(now)
	rs := c.st.Regions[r.Region]
	if rs == nil {
		rs = &RegionState{}
		c.st.Regions[r.Region] = rs
	}
	newest := r.Seq > rs.LastSeq
	fresh := newest || rs.Left || rs.Lapsed
	rs.LeaseEnd = max(rs.LeaseEnd, now+int64(c.cfg.Lease))
	rs.Lapsed = false
	rs.Policy = r.Policy
	rs.Answer = max(rs.Answer, r.Seq)
	if r.Seq > rs.LastSeq {
		rs.LastSeq = r.Seq
	}
	if r.Leave {
		if r.Seq < rs.LastSeq {
			return // an earlier agent's, overtaken by a later agent's reports
		}
		rs.Left, rs.Answer = true, 0
		for key, ks := range c.st.Keys {
			if h := ks.Regions[r.Region]; h != nil {
				delete(ks.Regions, r.Region)
				c.dirty[key] = true
				c.forgetIfIdle(key, ks)
			}
		}
		return
	}
	rs.Left = false
	current := r.Epoch == epochOf(c.st.Born)
	// A first claim in this epoch after the recovery is late: the shares it claims of a lost
	// state may have been granted to others since.
	late := current && r.Claimed && !rs.Claimed && !c.recovering(now)
	if r.Claimed && current {
		rs.Claimed = true
	}
	for _, kr := range r.Keys {
		c.dirty[kr.Key] = true
		ks := c.st.Keys[kr.Key]
		if ks == nil {
			ks = &KeyState{Regions: map[string]*Held{}}
			c.st.Keys[kr.Key] = ks
		}
		h := ks.Regions[r.Region]
		if h == nil {
			h = &Held{}
			ks.Regions[r.Region] = h
		}
		// A claim counts from the region's newest report only, and only if it knows every
		// version acknowledged: a report that arrives late says what was, not what is.
		if kr.Claim != nil && current && newest && kr.ClaimVersion >= h.Acked {
			c.claim(kr, h, late)
		}
		h.ack(kr.Acked)
		if fresh {
			h.Limit = kr.Limit
			if kr.Demand >= 0 {
				h.Demand = kr.Demand
			}
		}
	}
}

// claim takes a region's claim of the most it may apply of a key without a new grant (see
// KeyReport.Claim): of the versions it acknowledged, and of a lost state's. It replaces what the
// coordinator counted of them (the grants not acknowledged yet still count); a late claim is
// cut at once, before the region's lease is renewed by the same reply.
func (c *Coordinator) claim(kr KeyReport, h *Held, late bool) {
	h.AckedShare = *kr.Claim
	if late && *kr.Claim != (Share{}) {
		c.issue(h, kr.Key, Share{})
	}
	c.dirty[kr.Key] = true
}

// Step reallocates every key at now and returns the replies to send, one per region that
// reported since the last Step.
func (c *Coordinator) Step(now int64) []Reply {
	c.begin(now)
	for _, name := range sortedKeys(c.st.Regions) {
		rs := c.st.Regions[name]
		if !rs.Lapsed && !rs.Left && now > rs.LeaseEnd+int64(c.cfg.Margin) {
			c.lapse(name, rs)
		}
	}
	grow := !c.recovering(now)
	for _, key := range sortedKeys(c.st.Keys) {
		c.reallocate(key, c.st.Keys[key], now, grow)
	}
	var out []Reply
	for _, name := range sortedKeys(c.st.Regions) {
		rs := c.st.Regions[name]
		if rs.Answer == 0 {
			continue
		}
		c.st.Gen++
		rep := Reply{Region: name, Seq: rs.Answer, Epoch: epochOf(c.st.Born), Gen: c.st.Gen, Lease: c.cfg.Lease}
		for _, key := range sortedKeys(c.st.Keys) {
			if h := c.st.Keys[key].Regions[name]; h != nil {
				rep.Grants = append(rep.Grants, h.Issued...)
			}
		}
		rs.Answer = 0
		out = append(out, rep)
	}
	return out
}

// lapse cuts every share of a region whose lease has ended to its safe share. The region uses
// no more than that already (it falls to it at its lease's end, which is earlier), and every
// reply it gets from now on carries the cut, so it can never apply more again without
// applying the cut first: the cut counts as acknowledged.
func (c *Coordinator) lapse(name string, rs *RegionState) {
	rs.Lapsed = true
	for _, key := range sortedKeys(c.st.Keys) {
		h := c.st.Keys[key].Regions[name]
		if h == nil {
			continue
		}
		safe := rs.Policy.share(h.held(), h.Limit)
		if h.held() == safe && len(h.Issued) == 0 {
			continue
		}
		h.Issued = nil
		g := c.issue(h, key, safe)
		h.AckedShare = g.Share
		c.dirty[key] = true
	}
}

// reallocate moves key's shares toward max-min fair ones: cuts are granted at once, growth only
// within what the others hold (their cuts count until acknowledged).
func (c *Coordinator) reallocate(key string, ks *KeyState, now int64, grow bool) {
	names := sortedKeys(ks.Regions)
	var lim Share
	var active []string
	var fixed, total Share
	for i, name := range names {
		h, rs := ks.Regions[name], c.st.Regions[name]
		if i == 0 {
			lim = h.Limit
		}
		lim = lim.min(h.Limit)
		total = total.add(h.held())
		if rs.Lapsed {
			fixed = fixed.add(h.held())
			continue
		}
		active = append(active, name)
	}
	if len(active) == 0 {
		return
	}
	avail := lim.sub(fixed).max(Share{})
	demands := make([]int64, len(active))
	asked := false
	for i, name := range active {
		demands[i] = ks.Regions[name].Demand
		asked = asked || demands[i] > 0
	}
	// Max-min fair among the regions that use the key: what no demand asks for is spread over
	// all of them, so a region whose requests come now and then keeps a share between them. A
	// key nobody has asked for in IdleAfter is cut to nothing, then forgotten.
	switch {
	case asked:
		ks.Idle = 0
	case ks.Idle == 0:
		ks.Idle = now
	}
	want := make([]Share, len(active))
	if ks.Idle == 0 || now-ks.Idle < int64(c.idleAfter()) {
		want = targets(avail, demands)
	}
	step := max(lim.Rate/64, 1)
	bstep := max(lim.Burst/64, 1)
	differs := func(a, b Share) bool {
		if a == b {
			return false
		}
		if a.Rate == 0 || b.Rate == 0 {
			return true
		}
		return abs(a.Rate-b.Rate) >= step || abs(a.Burst-b.Burst) >= bstep
	}
	// Cuts first: they free nothing until acknowledged, but start at once.
	for i, name := range active {
		h := ks.Regions[name]
		cur := h.latest()
		if cut := cur.min(want[i]).normal(); cut != cur && differs(cut, cur) {
			c.issue(h, key, cut)
			c.dirty[key] = true
		}
	}
	for i, name := range active {
		if !grow {
			break
		}
		h := ks.Regions[name]
		cur := h.latest()
		room := lim.sub(total).add(h.held())
		grow := cur.max(want[i].min(room)).normal()
		if !grow.within(room) {
			continue
		}
		if grow != cur && differs(grow, cur) {
			before := h.held()
			c.issue(h, key, grow)
			total = total.sub(before).add(h.held())
			c.dirty[key] = true
		}
	}
	c.forgetIfIdle(key, ks)
}

// forgetIfIdle drops a key that no region holds or asks for.
func (c *Coordinator) forgetIfIdle(key string, ks *KeyState) {
	for _, h := range ks.Regions {
		if h.Demand > 0 || h.held() != (Share{}) || len(h.Issued) > 0 {
			return
		}
	}
	delete(c.st.Keys, key)
	c.dirty[key] = true
}

// TakeDirty returns the keys changed since the last call, each with its state (nil: the key is
// forgotten), to be written to the store; the state returned is c's own.
func (c *Coordinator) TakeDirty() map[string]*KeyState {
	out := make(map[string]*KeyState, len(c.dirty))
	for key := range c.dirty {
		out[key] = c.st.Keys[key]
	}
	clear(c.dirty)
	return out
}

// Counted returns the shares the coordinator counts for key at now, by region: what each
// region may be applying. Their sum is within the smallest limit reported for the key.
func (c *Coordinator) Counted(key string) map[string]Share {
	ks := c.st.Keys[key]
	if ks == nil {
		return nil
	}
	out := make(map[string]Share, len(ks.Regions))
	for name, h := range ks.Regions {
		out[name] = h.held()
	}
	return out
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
