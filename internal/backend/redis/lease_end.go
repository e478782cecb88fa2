package redis

import (
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// The end of leases: what they did not use, queued and given back to Redis by the sweeper
// (through the core's giveBack, giveback.go), and the leases ended all at once (a rule reload,
// a reset, Close).

// end ends s's lease (at index k), queueing what it did not use to be given back.
func (l *leases) end(k int, s *leaseSlot) {
	if s.left > 0 {
		r := backend.Request{Key: s.key, Limit: s.lim}
		if s.lim.Algorithm == limit.FixedWindow && l.mono() >= s.windowEnd-l.windowMargin()/2 {
			// Too late to give back within its window: the next one would get it.
			l.dropped.Add(uint64(s.left))
			l.held.Add(-s.left)
		} else {
			l.endHits(&r, s.left, s.heldUntil, s.expires)
		}
	}
	s.leased, s.left, s.size = false, 0, 0
	l.activeMu.Lock()
	delete(l.active, k)
	l.activeMu.Unlock()
}

// endHits queues n hits of r's key to be given back, from a lease whose charge ended at
// heldUntil and whose give-back expires at expires (see giveBack).
func (l *leases) endHits(r *backend.Request, n, heldUntil, expires int64) {
	l.activeMu.Lock()
	l.ended = append(l.ended, leftover{key: r.Key, lim: r.Limit, hits: n, heldUntil: heldUntil, expires: expires})
	l.queued.Store(int64(len(l.ended)))
	l.activeMu.Unlock()
}

// flush wakes the sweeper when hits are queued to be given back.
func (l *leases) flush() {
	if l.queued.Load() > 0 {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// sweep ends the leases past their time and gives back what they did not use, every quarter
// of a lifetime and when woken, until close.
func (l *leases) sweep() {
	defer close(l.done)
	t := time.NewTicker(max(l.lifetime/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.endExpired(false)
		case <-l.wake:
		}
		l.giveBack()
	}
}

// endExpired ends the leases past their time, or all of them.
func (l *leases) endExpired(all bool) {
	l.activeMu.Lock()
	ks := make([]int, 0, len(l.active))
	for k := range l.active {
		ks = append(ks, k)
	}
	l.activeMu.Unlock()
	now := l.mono()
	for _, k := range ks {
		s := &l.slots[k]
		s.mu.Lock()
		if s.leased && (all || now >= s.until) {
			l.end(k, s)
		}
		s.mu.Unlock()
	}
}

// giveBack sends what ended leases did not use back to Redis: one round trip per master, all
// at once, so that a master down or stalled drops (and delays) only its own keys' hits.
//
// A give-back cannot over-admit. It is valid only while its lease is: it carries the lease's
// expiry in Redis's clock, and one that reaches Redis later (this process paused, throttled or
// starved) gives nothing. It gives back only the lease's hits still ahead of Redis's now in
// the charge that took them (what time has not restored yet), and under GCRA in the terms the
// key's state holds, whatever the limit: a replica whose rule differs from another's during a
// rollout takes back its own hits and never re-expresses the key under its limit.
func (l *leases) giveBack() {
	l.activeMu.Lock()
	rs := l.ended
	l.ended = nil
	l.queued.Store(0)
	l.activeMu.Unlock()
	if len(rs) == 0 {
		return
	}
	l.held.Add(-sumHits(rs))
	returned, expired, dropped := l.next.giveBack(rs)
	l.returned.Add(uint64(returned))
	l.expired.Add(uint64(expired))
	l.dropped.Add(uint64(dropped))
}

func sumHits(rs []leftover) int64 {
	var n int64
	for i := range rs {
		n += rs[i].hits
	}
	return n
}

// release ends every lease; the sweeper gives back what they did not use (a rule reload:
// leases were charged under the old limits).
func (l *leases) release() {
	l.endExpired(true)
	l.flush()
}

// forget drops the leases of keys, giving nothing back: their state in Redis was deleted.
func (l *leases) forget(keys []string) {
	for _, key := range keys {
		k := l.slotOf(key)
		s := &l.slots[k]
		s.mu.Lock()
		if s.key == key {
			if s.leased {
				l.held.Add(-s.left)
				l.activeMu.Lock()
				delete(l.active, k)
				l.activeMu.Unlock()
			}
			s.clear()
		}
		s.mu.Unlock()
	}
}

// close stops the sweeper and gives back every lease: before the backend's nodes close.
func (l *leases) close() {
	close(l.stop)
	<-l.done
	l.endExpired(true)
	l.giveBack()
}
