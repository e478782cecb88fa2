package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// boundsFlags registers the flags bounding what a client's requests may make rls hold or do.
func boundsFlags(fs *flag.FlagSet, b *server.BoundsConfig) {
	fs.IntVar(&b.MaxRequestBytes, "max-request-bytes", b.MaxRequestBytes,
		"largest request accepted, as a gRPC message (answered RESOURCE_EXHAUSTED before it is read) or a POST /json body (413); Envoy's requests take a few hundred bytes")
	fs.Int64Var(&b.MaxInflightBytes, "max-inflight-bytes", b.MaxInflightBytes,
		"memory the requests being decided may hold at once (each counted by its descriptors and bytes, about 1.5 KiB for a typical Envoy request); a request past it is shed through the failure mode and counted in rls_inflight_shed_total; 0: no bound")
	fs.StringVar(&b.Overrides, "overrides", b.Overrides,
		"what a descriptor's limit override does: allow (decided by its own limit, in state of its own), ignore (decided by the rules as if it carried none) or refuse (the request is answered PERMISSION_DENIED)")
	fs.DurationVar(&b.OverrideMaxPeriod, "override-max-period", b.OverrideMaxPeriod,
		"longest period (unit × multiplier) an override may ask for; longer ones are answered INVALID_ARGUMENT (0: any)")
	fs.Int64Var(&b.MaxCalls, "grpc-max-calls", b.MaxCalls,
		"ShouldRateLimit calls open at once over all gRPC connections, each counted from its headers (it may hold up to --max-request-bytes while its message arrives); at the bound a new call takes the place of a call still waiting for its message after a second, which is cancelled (counted in rls_grpc_slow_calls_total, reason evicted), or else is refused UNAVAILABLE and counted in rls_grpc_calls_refused_total (0: no bound)")
	fs.Int64Var(&b.MaxNewKeysPerCaller, "max-new-keys-per-caller", b.MaxNewKeysPerCaller,
		"new keys a second (keys this replica has not let through in the last 30–60 s) one caller, by its client certificate's first name or else its IP address (IPv6: its /64), may make the backend create, burst the same; a request past it is refused RESOURCE_EXHAUSTED (POST /json: 429) and counted in rls_new_keys_refused_total. 0: no bound. Untrusted callers: about 100 (see docs/redis.md)")
}
