package regions

import "time"

// Report is what a region sends the coordinator every Δ (also when it has nothing to say: a
// report renews the region's lease).
type Report struct {
	Region string `json:"region"`
	// Seq numbers the region's reports, from 1; the Reply to a report names it. A region that
	// restarts starts again from a new random base, so a reply to an earlier run is never
	// taken for one to this run.
	Seq    uint64      `json:"seq"`
	Policy Policy      `json:"policy"`
	Keys   []KeyReport `json:"keys,omitempty"`
	// Leave says that the region applies no share any more (it shuts down): the coordinator
	// may give its shares away at once.
	Leave bool `json:"leave,omitempty"`
	// Claimed says that the report claims every share the region may apply (see
	// KeyReport.Claim): a region that holds nothing claims so with no key.
	Claimed bool `json:"claimed,omitempty"`
	// Epoch is the coordinator's epoch the region last heard of (0: none). Claims count only in
	// that epoch: a claim delayed from an earlier one may miss grants made since.
	Epoch uint64 `json:"epoch,omitempty"`
}

// KeyReport is one global key in a Report.
type KeyReport struct {
	Key string `json:"k"`
	// Limit is the key's whole limit as this region's rules say (rate per the key's period,
	// burst). Regions whose rules differ (mid-rollout) are held to the smallest.
	Limit Share `json:"l"`
	// Demand is the requests per period offered in the region (admitted or not), measured
	// over the last Δ; -1 when the region only acknowledges and its demand is unchanged.
	Demand int64 `json:"d"`
	// Acked is the last version of the key's share that the region applies, and applies
	// alone: no replica of the region uses an earlier one any more.
	Acked uint64 `json:"a,omitempty"`
	// Claim, after a new epoch began (the coordinator's state was lost), is the most the region
	// may apply of the key, of version ClaimVersion (of the earlier epoch): the new coordinator
	// counts it.
	Claim        *Share `json:"c,omitempty"`
	ClaimVersion uint64 `json:"cv,omitempty"`
}

// Reply is what the coordinator answers a Report with. It carries every grant the region has
// not acknowledged yet, not only the new ones, so a lost reply costs nothing but time.
type Reply struct {
	Region string `json:"region"`
	Seq    uint64 `json:"seq"`
	// Epoch names the coordinator's state: a new one begins when the state is lost (the
	// coordination store restarted empty). Gen numbers the replies of an epoch, across
	// coordinators: a region takes only a reply newer than every reply it took, so a reply that
	// arrives late never undoes a later one.
	Epoch uint64 `json:"epoch"`
	Gen   uint64 `json:"gen"`
	// Lease is how long after sending report Seq the region may apply its shares (measured on
	// its own clock). The coordinator counts them for Lease plus a margin after it received the
	// report, which is later.
	Lease  time.Duration `json:"lease"`
	Grants []Grant       `json:"grants,omitempty"`
}

// Grant is one version of a region's share of a key.
type Grant struct {
	Key     string `json:"k"`
	Version uint64 `json:"v"`
	Share   Share  `json:"s"`
}
