package redis

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// Leases let a replica decide most requests on a hot key without Redis, and still never admit
// a hit that was not charged in Redis first. When a key's demand at this replica is high and
// its remaining budget far above what a lease takes, the next request on it that goes to Redis
// carries a lease of k hits besides its own cost, charged by the same script under the same
// atomic rules. The replica then admits up to k requests of that key locally. What a lease did
// not use is given back (a refund) when it ends: a lifetime after it was charged (within a
// quarter lifetime more, the sweeper's tick), on a rule reload (PurgeCache) and at Close.
//
// k is about one lifetime of the key's demand here (twice its hits over the last half
// lifetime), and at most:
//   - what the limit's rate restores in one lifetime (Rate × lifetime / Period), so that a
//     lease that is never given back (a replica killed holding it) holds back at most that: the
//     key's budget is late by at most one lifetime, under GCRA; a fixed window gets it back
//     when the window ends;
//   - a quarter of what the key had left after its last decision in Redis, so that leases stop
//     well before a key runs out, and near its limit every decision goes to Redis as without
//     leases.
//
// A batch whose requests all have lease hits is answered here. One that mixes leased and other
// requests takes the leased hits first and sends the rest to Redis; the leased hits are kept
// only if the batch is charged there, and put back otherwise: all or nothing.
//
// A leased hit is counted in Redis from the instant its lease was charged, up to a lifetime
// before it is admitted; the remaining and reset a leased decision reports are the
// lease's: what Redis said when the lease was charged, plus the lease's unused hits, less
// what this replica took since. Other replicas' decisions since are not in them.
//
// Only GCRA and fixed-window limits of Enforce requests that charge (cost > 0, not a refund, not
// an overdraft charge) lease. The keys tracked are bounded: a table of leaseSlots entries by the
// key's hash, a key with a lease or with demand keeping its entry against colder keys.
type leases struct {
	next     *core        // what decides without leases, and gives back (see Backend.Decide on why not an interface)
	mono     func() int64 // the backend's monotonic clock
	lifetime time.Duration
	usable   int64 // ns: how long after its charge a lease admits (the lifetime)
	window   int64 // ns: the span demand is counted over (half the lifetime)
	seed     maphash.Seed
	slots    [leaseSlots]leaseSlot

	activeMu sync.Mutex
	active   map[int]struct{} // slots holding a lease
	ended    []leftover
	queued   atomic.Int64 // len(ended), read without the lock on the decision path
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}

	local    atomic.Uint64 // decisions answered from leases
	taken    atomic.Uint64 // leases charged in Redis
	returned atomic.Uint64 // hits given back
	dropped  atomic.Uint64 // unused hits not given back: a failed refund, a window already over
	expired  atomic.Uint64 // unused hits not given back because time had restored them: a late give-back
	held     atomic.Int64  // hits leased and not used or given back yet
}

const (
	leaseSlots = 4096
	// minLease is the smallest lease worth charging; a key leases once its demand here over
	// half a lifetime reaches it.
	minLease = 4
	// maxLeaseKeyBytes is the longest key that leases (as the local cache's bound).
	maxLeaseKeyBytes = maxCachedKeyBytes
)

// leaseSlot is one key's demand and lease, guarded by mu.
type leaseSlot struct {
	mu  sync.Mutex
	key string
	lim limit.Limit

	// Demand: hits in the half lifetime from since, and in the one before.
	since      int64 // mono
	hits, prev int64

	// What Redis said of the key after its last decision there: remaining, and (fixed window)
	// when its window ends (mono); known says whether they are.
	remaining int64
	windowEnd int64
	known     bool

	taking bool // a lease is on its way to Redis

	// The lease: left unused of size, admitting until until (mono). viewRemaining and resetAt
	// (mono) are what its decisions report.
	leased        bool
	left, size    int64
	until         int64
	viewRemaining int64
	resetAt       int64
	// In Redis's clock (µs): where the lease's charge ended (GCRA: the key's TAT after it;
	// fixed_window: its window's end) and when its give-back expires (see giveBack).
	heldUntil, expires int64
}

// leftover is what a lease did not use, on its way back to Redis: hits of key under lim, valid
// until expires (µs, Redis's clock) and, of them, only those still ahead of now in the lease's
// charge, which ended at heldUntil (see decide.lua's giveback).
type leftover struct {
	key                      string
	lim                      limit.Limit
	hits, heldUntil, expires int64
}

// clear empties s but for its lock, held.
func (s *leaseSlot) clear() {
	s.key, s.lim = "", limit.Limit{}
	s.since, s.hits, s.prev = 0, 0, 0
	s.remaining, s.windowEnd, s.known = 0, 0, false
	s.taking = false
	s.leased, s.left, s.size, s.until, s.viewRemaining, s.resetAt = false, 0, 0, 0, 0, 0
	s.heldUntil, s.expires = 0, 0
}

// newLeases returns the leases layer over next, and starts its sweeper (see close).
func newLeases(next *core, mono func() int64, lifetime time.Duration) *leases {
	l := &leases{next: next, mono: mono, lifetime: lifetime, usable: int64(lifetime), window: int64(lifetime / 2), seed: maphash.MakeSeed(),
		active: map[int]struct{}{}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.sweep()
	return l
}

// eligible reports whether r may take hits from a lease.
func eligible(r *backend.Request) bool {
	return r.Mode == backend.Enforce && r.Cost > 0 && !r.Refund && !r.Limit.Overdraft && !r.Limit.Shared && r.Limit.Rate > 0 &&
		(r.Limit.Algorithm == limit.GCRA || r.Limit.Algorithm == limit.FixedWindow) && len(r.Key) <= maxLeaseKeyBytes
}

func (l *leases) slotOf(key string) int {
	return int(maphash.String(l.seed, key) % leaseSlots)
}

// leaseScratch is one Decide's working state with leases, pooled.
type leaseScratch struct {
	slot   []int   // per request: its slot, or -1 when it does not lease
	local  []bool  // per request: its hits taken from a lease
	extra  []int64 // per request: the lease it carries to Redis
	sub    []backend.Request
	subOut []backend.Decision
	subIdx []int
	at     []int64    // per request sent to Redis: the instant Redis decided it at (µs)
	from   [][2]int64 // per request taken from a lease: the lease's heldUntil and expires
}

var leaseScratches = sync.Pool{New: func() any { return new(leaseScratch) }}

func (s *leaseScratch) reset(n int) {
	s.slot = resize(s.slot, n)
	s.local = resize(s.local, n)
	s.extra = resize(s.extra, n)
	s.at = resize(s.at, n)
	s.from = resize(s.from, n)
	clear(s.local)
	clear(s.extra)
	s.sub, s.subOut, s.subIdx = s.sub[:0], s.subOut[:0], s.subIdx[:0]
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Decide decides the batch as the core does, answering from leases what they hold and
// taking leases for hot keys on the way (see leases).
func (l *leases) Decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	sc := leaseScratches.Get().(*leaseScratch)
	defer leaseScratches.Put(sc)
	sc.reset(len(reqs))
	now := l.mono()
	nLocal, nExtra, nSlot := 0, 0, 0
	for i := range reqs {
		sc.slot[i] = -1
		r := &reqs[i]
		if !eligible(r) || repeated(reqs, i) {
			continue
		}
		k := l.slotOf(r.Key)
		s := &l.slots[k]
		s.mu.Lock()
		if !l.track(s, r, now) {
			s.mu.Unlock()
			continue
		}
		sc.slot[i] = k
		nSlot++
		if s.leased && (now >= s.until || s.left < r.Cost) {
			// Past its time, or too small for r: the next lease replaces it.
			l.end(k, s)
		}
		switch {
		case s.leased && s.left >= r.Cost:
			s.left -= r.Cost
			s.viewRemaining -= r.Cost
			out[i] = backend.Decision{Allowed: true, Remaining: max(s.viewRemaining, 0), ResetAfter: l.resetOf(s, now)}
			sc.local[i] = true
			sc.from[i] = [2]int64{s.heldUntil, s.expires}
			nLocal++
		case !s.leased && !s.taking:
			if n := l.size(s, r, now); n > 0 {
				sc.extra[i] = n
				s.taking = true
				nExtra++
			}
		}
		s.mu.Unlock()
	}
	l.flush()
	if nLocal == len(reqs) {
		l.held.Add(-sumCost(reqs))
		l.local.Add(1)
		return true, nil
	}
	if nSlot == 0 {
		return l.next.Decide(ctx, reqs, out)
	}

	// The rest goes to Redis, with the leases some requests carry.
	sub, subOut := reqs, out
	copied := nLocal > 0 || nExtra > 0 // sub is a copy: its decisions go back into out
	if copied {
		for i := range reqs {
			if sc.local[i] {
				continue
			}
			r := reqs[i]
			r.Cost += sc.extra[i]
			sc.sub = append(sc.sub, r)
			sc.subIdx = append(sc.subIdx, i)
		}
		sc.subOut = resize(sc.subOut, len(sc.sub))
		sub, subOut = sc.sub, sc.subOut
	}
	sent := now
	at := resize(sc.at, len(sub))
	_, err := l.next.decideAt(ctx, sub, subOut, at)
	charged := err == nil && backend.Charged(sub, subOut)
	if err == nil && !charged && nExtra > 0 && l.refusedByLease(sc, sub, subOut) {
		// A lease that did not fit refused the batch, which might fit without it: once more,
		// without the leases.
		for n, i := range sc.subIdx {
			if sc.extra[i] > 0 {
				l.untake(sc.slot[i])
				sc.extra[i] = 0
				sub[n].Cost = reqs[i].Cost
			}
		}
		nExtra = 0
		sent = l.mono()
		_, err = l.next.decideAt(ctx, sub, subOut, at)
		charged = err == nil && backend.Charged(sub, subOut)
	}
	if err != nil || !charged {
		l.putBack(reqs, out, sc)
		if err != nil {
			return false, err
		}
	}
	if copied {
		for n, i := range sc.subIdx {
			out[i] = subOut[n]
		}
	}

	// What Redis said, and the leases it charged.
	for n, i := range sc.subIdx {
		if sc.extra[i] > 0 {
			l.granted(sc.slot[i], &reqs[i], sc.extra[i], &out[i], charged && subOut[n].Allowed, sent, at[n])
		}
	}
	for i := range reqs {
		if k := sc.slot[i]; k >= 0 && !sc.local[i] && sc.extra[i] == 0 {
			l.learn(k, &reqs[i], out[i], sent)
		}
	}
	if charged {
		for i := range reqs {
			if sc.local[i] {
				l.held.Add(-reqs[i].Cost)
			}
		}
	}
	return backend.Admitted(reqs, out), nil
}

func sumCost(reqs []backend.Request) int64 {
	var n int64
	for i := range reqs {
		n += reqs[i].Cost
	}
	return n
}

// track counts r's demand in s, taking s for r's key when it is free or its key is cold. It
// reports whether s is r's key's.
func (l *leases) track(s *leaseSlot, r *backend.Request, now int64) bool {
	if s.key != r.Key || s.lim != r.Limit {
		if s.leased || s.taking || (s.key != "" && l.demand(s, now) >= minLease) {
			return false
		}
		s.clear()
		s.key, s.lim, s.since = r.Key, r.Limit, now
	}
	if d := now - s.since; d >= l.window {
		if d < 2*l.window {
			s.prev = s.hits
		} else {
			s.prev = 0
		}
		s.hits, s.since = 0, now
	}
	s.hits += r.Cost
	return true
}

// demand is s's hits over the last half lifetime.
func (l *leases) demand(s *leaseSlot, now int64) int64 {
	switch d := now - s.since; {
	case d < l.window:
		return max(s.hits, s.prev)
	case d < 2*l.window:
		return s.hits
	}
	return 0
}

// size returns the lease the next request r of s's key should carry to Redis: 0 for none.
func (l *leases) size(s *leaseSlot, r *backend.Request, now int64) int64 {
	if !s.known {
		return 0
	}
	// About one lifetime of this replica's traffic: twice the demand of half of one.
	k := 2 * l.demand(s, now)
	if k < minLease {
		return 0
	}
	// What the rate restores in one lifetime: Rate ≤ 2^32 and a lifetime under a few seconds
	// keep the product below 2^63.
	restores := int64(float64(r.Limit.Rate) * float64(l.lifetime) / float64(r.Limit.Period))
	k = min(k, restores, (s.remaining-r.Cost)/4)
	if r.Limit.Algorithm == limit.FixedWindow && s.windowEnd-now < l.windowMargin() {
		return 0 // the window ends before a lease could be used and given back
	}
	if k < minLease {
		return 0
	}
	return k
}

// windowMargin is how long before its window ends a fixed-window lease stops admitting: a
// lifetime, time for its refund to reach Redis within the window it was charged in (a refund
// after the window would give hits back to the next one). A refund not sent by half of it
// before the window ends is dropped.
func (l *leases) windowMargin() int64 { return int64(l.lifetime) }

func (l *leases) resetOf(s *leaseSlot, now int64) time.Duration {
	if s.lim.Algorithm == limit.FixedWindow {
		return time.Duration(max(s.windowEnd-now, 0))
	}
	return time.Duration(max(s.resetAt-now, 0))
}

// learn records what Redis said of r's key after a decision there, sent at sent.
func (l *leases) learn(k int, r *backend.Request, d backend.Decision, sent int64) {
	s := &l.slots[k]
	s.mu.Lock()
	if s.key == r.Key && s.lim == r.Limit {
		s.remaining, s.windowEnd, s.known = d.Remaining, sent+int64(d.ResetAfter), true
	}
	s.mu.Unlock()
}

// granted ends the taking of a lease of n hits that r carried: charged, it is the slot's lease
// now, and d, the decision of r with the lease, becomes r's own (the lease's hits are this
// replica's still). at is the instant Redis decided r at (µs, its clock).
func (l *leases) granted(k int, r *backend.Request, n int64, d *backend.Decision, charged bool, sent, at int64) {
	s := &l.slots[k]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taking = false
	if !charged {
		if s.key == r.Key && s.lim == r.Limit {
			s.remaining, s.windowEnd, s.known = d.Remaining, sent+int64(d.ResetAfter), true
		}
		return
	}
	heldUntil, expires := l.validity(r, d, at)
	if s.key != r.Key || s.lim != r.Limit {
		// Its key was reset meanwhile (forget): the lease goes back at once.
		l.held.Add(n)
		l.endHits(r, n, heldUntil, expires)
		return
	}
	s.remaining, s.windowEnd, s.known = d.Remaining, sent+int64(d.ResetAfter), true
	d.Remaining += n
	s.leased, s.left, s.size = true, n, n
	s.until = sent + l.usable
	if r.Limit.Algorithm == limit.FixedWindow {
		s.until = min(s.until, s.windowEnd-l.windowMargin())
	}
	s.viewRemaining = d.Remaining
	s.resetAt = sent + int64(d.ResetAfter)
	s.heldUntil, s.expires = heldUntil, expires
	l.taken.Add(1)
	l.held.Add(n)
	l.activeMu.Lock()
	l.active[k] = struct{}{}
	l.activeMu.Unlock()
}

// validity returns where the charge of r's lease ended in Redis's clock (µs), from r's decision
// d with the lease, which Redis made at at, and when its give-back expires: half a lifetime
// after the lease stops admitting, time for the sweeper (every quarter lifetime) to send it.
// A GCRA reset is rounded up to the µs: the charge ended at most 1 µs before at + reset, and
// taking 1 µs less never counts a hit as held that is not. A fixed window's reset is exact: its
// end, which the give-back must name exactly.
func (l *leases) validity(r *backend.Request, d *backend.Decision, at int64) (heldUntil, expires int64) {
	heldUntil = at + int64(d.ResetAfter/time.Microsecond)
	if r.Limit.Algorithm != limit.FixedWindow {
		heldUntil--
	}
	life := int64(l.lifetime / time.Microsecond)
	return heldUntil, at + life + life/2
}

// untake ends the taking of a lease that was not charged.
func (l *leases) untake(k int) {
	s := &l.slots[k]
	s.mu.Lock()
	s.taking = false
	s.mu.Unlock()
}

// refusedByLease reports whether some request that carried a lease was denied.
func (l *leases) refusedByLease(sc *leaseScratch, sub []backend.Request, subOut []backend.Decision) bool {
	for n, i := range sc.subIdx {
		if sc.extra[i] > 0 && !subOut[n].Allowed {
			return true
		}
	}
	return false
}

// putBack returns the hits taken from leases for a batch that was not charged, and ends the
// taking of the leases it carried. The local decisions then describe the state without them.
func (l *leases) putBack(reqs []backend.Request, out []backend.Decision, sc *leaseScratch) {
	for i := range reqs {
		k := sc.slot[i]
		if k < 0 {
			continue
		}
		if sc.extra[i] > 0 {
			l.untake(k)
			sc.extra[i] = 0
		}
		if !sc.local[i] {
			continue
		}
		s := &l.slots[k]
		s.mu.Lock()
		if s.leased && s.key == reqs[i].Key {
			s.left += reqs[i].Cost
			s.viewRemaining += reqs[i].Cost
		} else {
			// The lease ended meanwhile, giving back what it had left: these hits too.
			l.endHits(&reqs[i], reqs[i].Cost, sc.from[i][0], sc.from[i][1])
		}
		s.mu.Unlock()
		out[i].Remaining += reqs[i].Cost
	}
	l.flush()
}
