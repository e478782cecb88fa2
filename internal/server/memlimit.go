package server

import (
	"cmp"
	"math"
	"runtime/debug"
	"strconv"

	"github.com/rls-project/rls/internal/rlqs"
)

// What each thing the bounds count holds at most, for the worst case below: the figures of
// docs/operating.md's Memory table, measured where they could be.
const (
	idleBytes          = 32 << 20 // an idle rls: about 30 MB
	connBytes          = 24 << 10 // an open gRPC connection: about 23 kB
	callBytes          = 16 << 10 // a call's goroutine and bookkeeping, besides its message
	redisCacheKeyBytes = 773      // an entry of the Redis backend's over-limit cache
	redisLeasesBytes   = 3 << 20  // the Redis backend's leases: 4096 keys of at most 512 bytes
	rlqsStreamBytes    = 27 << 10 // an RLQS stream's own (docs/rlqs.md)
	rlqsBucketBytes    = 768      // an RLQS bucket's own, besides its id
)

// WorstCaseBytes is the most the configured bounds let clients make rls hold, term by term as
// docs/operating.md's Memory table adds it: an idle rls, the gRPC connections, the calls whose
// message is arriving, the requests being decided, the memory backend's state (with Redis: the
// local failure mode's state, the over-limit cache and the leases), and with --rlqs its streams,
// the reports they may be reading or decoding and their buckets. False when a bound it needs is off (0):
// --grpc-max-connections, --grpc-max-calls or --max-inflight-bytes.
func (c Config) WorstCaseBytes() (int64, bool) {
	if c.GRPC.MaxConnections == 0 || c.Bounds.MaxCalls == 0 || c.Bounds.MaxInflightBytes == 0 {
		return 0, false
	}
	w := int64(idleBytes) +
		int64(c.GRPC.MaxConnections)*connBytes +
		c.Bounds.MaxCalls*(int64(c.maxRecvMsgSize())+callBytes) +
		c.Bounds.MaxInflightBytes +
		c.Memory.MaxBytes // the memory backend's state, or with Redis the local failure mode's
	if c.Backend == "redis" {
		w += int64(c.Redis.LocalCacheSize)*redisCacheKeyBytes + redisLeasesBytes
	}
	if r := c.RLQS; r.Enabled {
		// docs/rlqs.md's worst case of reports arriving at once: every stream's report of up to
		// --rlqs-max-report-bytes read by gRPC in frames and copied into one buffer, and 25
		// times --rlqs-report-budget-bytes decoded; then its streams and buckets.
		w += int64(r.MaxStreams)*(rlqsStreamBytes+2*int64(r.MaxReportBytes)) +
			25*cmp.Or(r.ReportBudget, rlqs.DefaultReportBudget) +
			r.MaxBucketBytes*5/2 + int64(r.MaxTotalBuckets)*rlqsBucketBytes
	}
	return w, true
}

// MemoryLimit is the Go memory limit rls sets when GOMEMLIMIT is not set: the worst case plus a
// quarter, for the garbage the collector has not reclaimed yet. The runtime then collects harder
// as the heap nears it, where by default it lets the heap grow to twice what is live. False
// when the worst case has no bound.
func (c Config) MemoryLimit() (int64, bool) {
	w, ok := c.WorstCaseBytes()
	if !ok {
		return 0, false
	}
	return w + w/4, true
}

// SetMemoryLimit sets the process's Go memory limit to c.MemoryLimit, unless c.Env sets
// GOMEMLIMIT (the runtime has read it) or the bounds are off. Serve calls it; New logs the limit
// in force.
func SetMemoryLimit(c Config) {
	if _, set := envMap(c.Env)["GOMEMLIMIT"]; set {
		return
	}
	if limit, ok := c.MemoryLimit(); ok {
		debug.SetMemoryLimit(limit)
	}
}

// logMemoryLimit says what Go memory limit is in force and where it comes from.
func (s *Server) logMemoryLimit() {
	limit := debug.SetMemoryLimit(-1)
	worst, bounded := s.cfg.WorstCaseBytes()
	from := "bounds"
	if v, set := envMap(s.cfg.Env)["GOMEMLIMIT"]; set {
		from = "GOMEMLIMIT=" + v
	} else if limit == math.MaxInt64 {
		from = "none"
	} else if want, _ := s.cfg.MemoryLimit(); limit != want {
		from = "the program"
	}
	worstCase := "unbounded (--grpc-max-connections, --grpc-max-calls or --max-inflight-bytes is 0)"
	if bounded {
		worstCase = strconv.FormatInt(worst, 10)
	}
	s.log.Info("go memory limit", "limit_bytes", limit, "from", from, "worst_case_bytes", worstCase)
}
