package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// rlqsFlags registers the Rate Limit Quota Service's flags on fs.
func rlqsFlags(fs *flag.FlagSet, rc *server.RLQSConfig) {
	fs.BoolVar(&rc.Enabled, "rlqs", rc.Enabled, "serve Envoy's Rate Limit Quota Service (StreamRateLimitQuotas, for the rate_limit_quota filter) on --grpc-addr; off unless asked for, as a ShouldRateLimit deployment needs none of it")
	fs.IntVar(&rc.MaxReportBytes, "rlqs-max-report-bytes", rc.MaxReportBytes,
		"RLQS: largest usage report accepted (a larger one ends its stream with RESOURCE_EXHAUSTED). gRPC bounds every method's messages alike, so with --rlqs this is also the bound to which a ShouldRateLimit message is read before --max-request-bytes refuses it")
	fs.DurationVar(&rc.TTL, "rlqs-assignment-ttl", rc.TTL,
		"RLQS: time to live of every quota assignment: how long a proxy enforces its share without hearing from rls, and how long a vanished proxy's share stays held (a few of the filter's reporting intervals)")
	fs.DurationVar(&rc.Tick, "rlqs-tick", rc.Tick,
		"RLQS: how often each stream's shares are decided again between reports; the share of a proxy alone in its bucket and at its target only every quarter of the TTL (at most 1s); a share released or wanted wakes the proxies concerned at once")
	fs.IntVar(&rc.MaxBuckets, "rlqs-max-buckets", rc.MaxBuckets, "RLQS: most buckets one stream may report (more ends the stream with RESOURCE_EXHAUSTED)")
	fs.IntVar(&rc.MaxStreams, "rlqs-max-streams", rc.MaxStreams,
		"RLQS: most streams open at once on this replica, whoever opens them (one more is refused with RESOURCE_EXHAUSTED)")
	fs.IntVar(&rc.MaxTotalBuckets, "rlqs-max-total-buckets", rc.MaxTotalBuckets,
		"RLQS: most buckets of all streams together (a bucket on two streams counts twice); a report that would add one more ends its stream with RESOURCE_EXHAUSTED")
	fs.Int64Var(&rc.MaxBucketBytes, "rlqs-max-bucket-bytes", rc.MaxBucketBytes,
		"RLQS: most bytes of the distinct bucket ids of all streams together (each id is kept once); a report that would pass it ends its stream with RESOURCE_EXHAUSTED")
	fs.IntVar(&rc.MaxProxies, "rlqs-max-proxies-per-bucket", rc.MaxProxies,
		"RLQS: most proxies (streams, on every replica sharing Redis) one bucket's limit is divided among; one more ends its stream with RESOURCE_EXHAUSTED")
	fs.Int64Var(&rc.ReportBudget, "rlqs-report-budget-bytes", rc.ReportBudget,
		"RLQS: most bytes of usage reports, of all streams together, decoded and taken in at once (a report costs many times its size decoded); a report finding no room within 1s ends its stream with RESOURCE_EXHAUSTED. At least --rlqs-max-report-bytes; 0: the default")
	fs.StringVar(&rc.Domains, "rlqs-domains", rc.Domains,
		"RLQS: the only domains served, comma-separated (default: every domain); a stream naming another ends with PERMISSION_DENIED")
	fs.BoolVar(&rc.SubsecondTTLs, "rlqs-testing-subsecond-ttl", rc.SubsecondTTLs,
		"RLQS, for tests only: accept a --rlqs-assignment-ttl that is not a whole number of seconds (Envoy reads it in whole seconds: a 300ms TTL expires at once there)")
}
