package redis

import (
	"context"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Redis memory, as a node's health check sees it.
//
// A full Redis either evicts keys (its maxmemory-policy) or refuses writes ("OOM command not
// allowed"). Every key rls writes has an expiry, and the epoch key has none: under the
// volatile-* policies the epoch is never evicted, and its disappearance is a data loss. Under
// the allkeys-* policies Redis may evict the epoch key like any other, so a missing epoch is
// told apart from a loss by Redis's own counters (INFO), read before the epoch at every check:
// a restart changes the server's run_id; a FLUSHALL or FLUSHDB counts a call in commandstats;
// an eviction counts in evicted_keys. An epoch gone with the same run_id, no flush and more
// keys evicted was evicted: logged, not counted as a loss, and the denial cache kept. One gone
// otherwise (a restart, a flush, a DEL, or counters that went backwards: CONFIG RESETSTAT) is a
// loss, as is any when INFO is refused (an ACL): then nothing can be told apart.

// infoSnap is what one reading of a node's INFO says.
type infoSnap struct {
	ok      bool   // INFO answered
	runID   string // changes at every start of the server
	evicted int64  // keys evicted since the start (or CONFIG RESETSTAT)
	flushes int64  // FLUSHALL and FLUSHDB calls since the start (or CONFIG RESETSTAT)
	policy  string // maxmemory-policy
}

// infoSections are the sections read, one INFO call each (Redis before 7 takes one section
// per call).
var infoSections = []string{"server", "stats", "memory", "commandstats"}

// readInfo reads the node's INFO on the probe's connection, in one round trip.
func (n *node) readInfo(ctx context.Context) (infoSnap, error) {
	pipe := n.probe.Pipeline()
	cmds := make([]*goredis.StringCmd, len(infoSections))
	for i, s := range infoSections {
		cmds[i] = pipe.Info(ctx, s)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return infoSnap{}, err
	}
	var s infoSnap
	for _, c := range cmds {
		parseInfo(c.Val(), &s)
	}
	s.ok = s.runID != ""
	return s, nil
}

// parseInfo reads the fields of infoSnap from the text of INFO into s.
func parseInfo(text string, s *infoSnap) {
	for line := range strings.SplitSeq(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\r"), ":")
		if !ok {
			continue
		}
		switch k {
		case "run_id":
			s.runID = v
		case "evicted_keys":
			s.evicted, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			s.policy = v
		case "cmdstat_flushall", "cmdstat_flushdb":
			// calls=N,usec=...
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			c, _ := strconv.ParseInt(calls, 10, 64)
			s.flushes += c
		}
	}
}

// epochVerdict says why a known epoch is gone or changed, from the INFO read before it was last
// seen (was) and the one read after it was found gone (now); evicted is true when it was
// evicted rather than lost.
func epochVerdict(was, now infoSnap) (why string, evicted bool) {
	switch {
	case !was.ok || !now.ok:
		return "its epoch key is gone", false
	case was.runID != now.runID:
		return "its epoch key is gone, and Redis restarted (its run_id changed)", false
	case now.flushes < was.flushes || now.evicted < was.evicted:
		return "its epoch key is gone, and Redis's counters were reset (CONFIG RESETSTAT): a loss cannot be ruled out", false
	case now.flushes > was.flushes:
		return "its epoch key is gone, and Redis was flushed (FLUSHALL or FLUSHDB)", false
	case now.evicted > was.evicted:
		return "", true
	default:
		return "its epoch key was deleted", false
	}
}

// watchInfo reads the node's INFO and counts the keys Redis evicted since the last reading
// (evictions before rls first read it are not counted; after a restart, those since it). It
// returns the reading.
func (n *node) watchInfo(ctx context.Context) infoSnap {
	s, err := n.readInfo(ctx)
	if err != nil || !s.ok {
		if err != nil && isReply(err) && n.infoRefused.CompareAndSwap(false, true) {
			n.deps.log.Info("redis refuses INFO: its evictions are not counted, and an evicted epoch key cannot be told from a data loss",
				"node", n.name, "err", err)
		}
		return infoSnap{}
	}
	was := n.lastInfo
	n.lastInfo = s
	if !was.ok {
		return s
	}
	more := s.evicted
	if s.runID == was.runID && s.evicted >= was.evicted {
		more = s.evicted - was.evicted
	}
	if more > 0 {
		n.evicted.Add(uint64(more))
		n.deps.warn.Warn("redis evicting "+n.name,
			"redis is full and evicting keys: each rate-limit key it evicts starts over with a fresh burst (raise maxmemory; see docs/redis.md on memory)",
			"node", n.name, "maxmemory_policy", s.policy, "evicted", more)
	}
	return s
}

// epochEvicted logs an epoch key Redis evicted: not a loss of data, but a policy that evicts
// keys without an expiry.
func (n *node) epochEvicted(policy string) {
	n.deps.warn.Warn("redis evicted epoch "+n.name,
		"redis evicted rls's epoch key: its maxmemory-policy evicts keys without an expiry; not a data loss, but rate-limit keys are evicted too (set maxmemory-policy volatile-ttl)",
		"node", n.name, "maxmemory_policy", policy)
}

// oomReply reports whether err is Redis refusing a write for want of memory ("OOM command not
// allowed when used memory > 'maxmemory'"): the node answered, it is not down.
func oomReply(err error) bool { return goredis.HasErrorPrefix(err, "OOM") }

// outOfMemory counts a call Redis refused for want of memory, and says so in the log (the
// first at once, then at most one line per interval with how many were not logged).
func (n *node) outOfMemory() {
	n.oom.Add(1)
	n.deps.warn.Warn("redis out of memory "+n.name,
		"redis out of memory: it refuses rls's writes (OOM command not allowed, maxmemory-policy noeviction or nothing left to evict); decisions on its keys get the failure mode until it has room (raise maxmemory, or set maxmemory-policy volatile-ttl)",
		"node", n.name)
}
