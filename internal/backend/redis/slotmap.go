package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Fetching a Cluster's slot map: asked of every node the topology knows of, at once, the view
// most of them hold taken.

// fetchSlots asks every node it knows of (the URL's seed nodes, the masters and replicas of the
// map) for the slot map, at once, and takes the view most of those answering within fetchLinger
// of the first hold: a node that is back from a pause may still tell its old view for a moment.
func (t *clusterTopo) fetchSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	asked := t.askable()
	type answer struct {
		ranges []goredis.ClusterSlot
		err    error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan answer, len(asked))
	for _, a := range asked {
		c := t.control(a)
		go func() {
			// CLUSTER SLOTS, which go-redis deprecates for CLUSTER SHARDS (Redis 7 and later):
			// rls serves Redis 6 too.
			cmd := goredis.NewClusterSlotsCmd(ctx, "cluster", "slots")
			_ = c.Process(ctx, cmd)
			r, err := cmd.Result()
			if err == nil {
				fillHosts(r, a)
				if len(r) == 0 {
					err = errors.New("CLUSTER SLOTS: no slots (is cluster mode on?)")
				}
			}
			answers <- answer{r, err}
		}()
	}
	var views [][]goredis.ClusterSlot
	var sigs []string
	var votes []int
	var errs []error
	var linger <-chan time.Time
	for range asked {
		var a answer
		select {
		case a = <-answers:
		case <-linger:
		case <-ctx.Done():
		}
		if a.ranges == nil && a.err == nil {
			break // lingered enough, or out of time
		}
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		if linger == nil {
			linger = time.After(fetchLinger)
		}
		i := slices.Index(sigs, rangesSig(a.ranges))
		if i < 0 {
			views, sigs, votes = append(views, a.ranges), append(sigs, rangesSig(a.ranges)), append(votes, 0)
			i = len(views) - 1
		}
		votes[i]++
	}
	if len(views) == 0 {
		if len(errs) == 0 {
			errs = append(errs, ctx.Err())
		}
		return nil, fmt.Errorf("no node answered CLUSTER SLOTS: %w", errors.Join(errs...))
	}
	best := 0
	for i := range views {
		if votes[i] > votes[best] {
			best = i
		}
	}
	return views[best], nil
}

// askable returns the nodes a fetch asks: the URL's seed nodes, then the map's masters and
// replicas.
func (t *clusterTopo) askable() []string {
	seen := map[string]bool{}
	var out []string
	add := func(a string) {
		if a != "" && !seen[a] && len(out) < maxAsked {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, a := range t.target.Addrs {
		add(a)
	}
	if m := t.Load(); m != nil {
		for _, n := range m.masters {
			add(n.name)
		}
		for _, a := range m.replicas {
			add(a)
		}
	}
	return out
}

// fillHosts gives the addresses with no host (a node that does not know its own address) the
// host of the node that answered, as Redis means.
func fillHosts(ranges []goredis.ClusterSlot, from string) {
	host, _, _ := net.SplitHostPort(from)
	for i := range ranges {
		for j := range ranges[i].Nodes {
			a := &ranges[i].Nodes[j].Addr
			h, p, err := net.SplitHostPort(*a)
			if err == nil && (h == "" || h == "?") {
				*a = net.JoinHostPort(host, p)
			}
		}
	}
}

// rangesSig is what a slot map says: each range's master, in order.
func rangesSig(ranges []goredis.ClusterSlot) string {
	parts := make([]string, 0, len(ranges))
	for _, r := range ranges {
		m := ""
		if len(r.Nodes) > 0 {
			m = r.Nodes[0].Addr
		}
		parts = append(parts, strconv.Itoa(r.Start)+"-"+strconv.Itoa(r.End)+"="+m)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
