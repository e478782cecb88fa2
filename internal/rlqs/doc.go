// Package rlqs serves Envoy's Rate Budget Quota Service (envoy.service.rate_limit_quota.v3):
// proxies stream usage reports per bucket and enforce locally the quota rls assigns them.
//
// A bucket maps to a rule: the stream's domain is the rule domain and the bucket id's key/value
// pairs are a descriptor's entries, tried in sorted key order first and then, for up to four
// keys, in every other order (lexicographic order of the permutations); the first order that
// matches a rule wins. A bucket that matches no rule (or an allow-listed, unlimited or shadow
// rule) is assigned ALLOW_ALL, as ShouldRateLimit answers OK for a descriptor without a rule.
//
// Shares are max-min fair: for each bucket the rule's rate is divided among the proxies that
// reported it within the assignment's time to live, by their demand (allowed + denied per
// second, see demandWindow); a proxy wanting less than an equal share gets its demand (plus a
// margin), the others split the rest, and capacity nobody asks for is spread evenly; 1/32 of
// the rate is never held.
// Each proxy's max_tokens is its rate's part of an eighth of the burst; the rest of the burst is
// a budget that pays for every token bucket Envoy starts full (see bucketState), so that what the
// proxies admit over any window of T stays within rate·T + burst. A
// share only grows into what the other proxies do not hold: every assignment sent is held until
// its time to live ends, so the sum of what proxies may be enforcing never exceeds the limit,
// across replicas too when the Store is Redis.
//
// With mutual TLS a proxy is its client certificate: the streams of one identity are one proxy
// of each bucket (see bucketState.targets). Streams, buckets, the bytes of bucket ids and the
// proxies of a bucket are bounded in all (see Options), and what a stream held is released when
// it ends.
package rlqs
