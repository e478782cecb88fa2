package regions

import "time"

// View is one replica's copy of its region's published table. A replica applies it for at most
// a table lease after it began fetching it (then it fetches again before deciding a global
// key), and each key's safe share once the table's own end has passed.
type View struct {
	pub     Published
	fetched int64 // on the replica's clock, when the fetch began
	until   int64 // on the replica's clock, when the table ends
	lease   time.Duration
	policy  Policy
}

// NewView returns a view of pub, fetched from a store whose clock read storeNow when it
// answered, the fetch having begun at fetched on the replica's clock. pub.ValidUntil is on the
// store's clock.
func NewView(pub Published, storeNow, fetched int64, lease time.Duration, policy Policy) *View {
	return &View{pub: pub, fetched: fetched, until: fetched + (pub.ValidUntil - storeNow), lease: lease, policy: policy}
}

// Stale reports whether the view may not be applied at now: it must be fetched again first.
func (v *View) Stale(now int64) bool { return v == nil || now >= v.fetched+int64(v.lease) }

// Share returns key's share at now, under lim (the key's whole limit, as the rules say). Call
// Stale first: a stale view's shares may already have been given to other regions.
func (v *View) Share(key string, lim Share, now int64) Share {
	s := v.pub.Shares[key]
	if now >= v.until {
		return v.policy.share(s, lim)
	}
	return s
}

// GoodUntil returns the instant until which the shares Share gives at at hold: the end of the
// view's lease and, while the table has not ended at at, the table's end (after it, the safe
// shares hold, which are the region's whatever the others are given).
func (v *View) GoodUntil(at int64) int64 {
	until := v.fetched + int64(v.lease)
	if at < v.until {
		until = min(until, v.until)
	}
	return until
}

// Version returns the version of key's share in the view (0: none).
func (v *View) Version(key string) uint64 { return v.pub.Versions[key] }
