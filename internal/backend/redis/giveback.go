package redis

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// giveBack sends what ended leases did not use back to Redis: one round trip per master, all
// at once, so that a master down or stalled drops (and delays) only its own keys' hits. It
// returns the hits given back, those time had restored already (expired), and those not given
// back (dropped).
//
// A give-back cannot over-admit. It is valid only while its lease is: it carries the lease's
// expiry in Redis's clock, and one that reaches Redis later (this process paused, throttled or
// starved) gives nothing. It gives back only the lease's hits still ahead of Redis's now in
// the charge that took them (what time has not restored yet), and under GCRA in the terms the
// key's state holds, whatever the limit: a replica whose rule differs from another's during a
// rollout takes back its own hits and never re-expresses the key under its limit.
func (c *core) giveBack(rs []leftover) (returned, expired, dropped int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for n, g := range c.byMaster(rs) {
		wg.Go(func() {
			r, e, d := c.sendGiveBack(n, g)
			mu.Lock()
			returned, expired, dropped = returned+r, expired+e, dropped+d
			mu.Unlock()
		})
	}
	wg.Wait()
	return returned, expired, dropped
}

// byMaster splits rs by the master that owns their keys now: nil for those whose master is
// not known (no slot map, or a slot it has lost).
func (c *core) byMaster(rs []leftover) map[*node][]leftover {
	b := c
	if !b.cluster {
		return map[*node][]leftover{b.single: rs}
	}
	t := b.topo.Load()
	groups := map[*node][]leftover{}
	for _, r := range rs {
		var n *node
		if t != nil {
			n = t.owner[slot(storedKey(b.prefix, r.key))]
		}
		groups[n] = append(groups[n], r)
	}
	return groups
}

// sendGiveBack gives back rs, whose keys n owns, in one round trip: one script call per
// Cluster slot. It returns the hits given back, those time had restored already (expired) and
// those not given back (dropped).
func (c *core) sendGiveBack(n *node, rs []leftover) (returned, expired, dropped int64) {
	b := c
	if n == nil || !n.br.Allow() {
		hits := sumHits(rs)
		b.log.Debug("redis: unused lease hits not given back: their master is down or unknown", "hits", hits)
		return 0, 0, hits
	}
	type part struct {
		keys []string
		vals []byte
		idx  []int
	}
	var parts []part
	bySlot := map[int]int{}
	for i := range rs {
		key := storedKey(b.prefix, rs[i].key)
		s := 0
		if b.cluster {
			s = slot(key)
		}
		p, ok := bySlot[s]
		if !ok {
			p = len(parts)
			bySlot[s] = p
			parts = append(parts, part{})
		}
		parts[p].keys = append(parts[p].keys, key)
		parts[p].vals = appendGiveBack(parts[p].vals, &rs[i])
		parts[p].idx = append(parts[p].idx, i)
	}
	cmds := make([]*goredis.Cmd, len(parts))
	for p := range parts {
		cmds[p] = newScriptCmd(giveBackArgs(script.Hash(), b.nowArg(), parts[p].keys, parts[p].vals))
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(b.timeout, 100*time.Millisecond))
	defer cancel()
	n.observe(n.exec(ctx, cmds, nil), cmds)
	var late int64
	for p, cmd := range cmds {
		reply, err := cmd.Text()
		var given []int64
		var wasLate []bool
		if err == nil {
			given, wasLate, err = decodeGiven(reply, len(parts[p].keys))
		}
		if err != nil {
			for _, i := range parts[p].idx {
				dropped += rs[i].hits
			}
			b.log.Debug("redis: unused lease hits not given back", "keys", len(parts[p].keys), "err", err)
			continue
		}
		for j, i := range parts[p].idx {
			returned += given[j]
			expired += rs[i].hits - given[j]
			if wasLate[j] {
				late += rs[i].hits
			}
		}
	}
	if late > 0 {
		b.log.Debug("redis: unused lease hits reached Redis after their leases expired and were not given back", "hits", late)
	}
	return returned, expired, dropped
}
