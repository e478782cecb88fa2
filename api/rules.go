// Package api holds rls's public contract: the Go types of the rule file format.
//
// The format is envoyproxy/ratelimit's YAML, so existing rule files load unchanged, plus a few
// extensions (burst, unit_multiplier, rate_limits, failure_mode). One file holds one domain:
//
//	domain: api
//	descriptors:
//	  - key: api_key
//	    rate_limit: {unit: minute, requests_per_unit: 60, burst: 10}
//	    descriptors:
//	      - key: path
//	        value: "/login*"
//	        rate_limits:
//	          - {unit: second, requests_per_unit: 10}
//	          - {unit: day, requests_per_unit: 250}
//
// rls decodes these types strictly: an unknown or repeated key, a null list item, a count that is
// not a whole number in range, or a second YAML document in the file is an error, reported with
// its file and line. Anchors, aliases and merge keys ("<<") are followed.
//
// The yaml tags are the format's keys, named once: the loader's lists of known keys are read
// from them, and a test holds the rules rls builds from xDS to them.
package api

// RuleFile is one rule file: a domain and its descriptor tree.
type RuleFile struct {
	// Domain names the rule set; it must equal RateLimitRequest.domain. Required and unique
	// across all loaded files.
	Domain string `yaml:"domain"`
	// Descriptors are the first level of the tree, matched against a request descriptor's first
	// entry.
	Descriptors []Descriptor `yaml:"descriptors"`
}

// Descriptor is one node of the rule tree, matched against one entry of a request descriptor.
type Descriptor struct {
	// Key must equal the entry's key. Required.
	Key string `yaml:"key"`
	// Value, when set, must equal the entry's value; '*' in it matches any run of characters, any
	// number of times ("user-*", "*.example.com", "*"). When empty the node is the key's default:
	// it matches any value that no sibling with a value matched.
	Value string `yaml:"value"`
	// RateLimit is the limit applied when this node is matched by the last entry of a request
	// descriptor. A node without RateLimit (and without RateLimits) applies no limit: it
	// allow-lists what it matches.
	RateLimit *RateLimit `yaml:"rate_limit"`
	// RateLimits is an rls extension: several limits on one node (10 per second and 250 per day),
	// all of which must admit a request. Mutually exclusive with RateLimit. Each keeps its own
	// state, keyed by its Name, else by its period and algorithm, never by its place in the
	// list; two that would share state (one name, or unnamed with one period and algorithm)
	// are an error.
	RateLimits []RateLimit `yaml:"rate_limits"`
	// Concurrency is an rls extension: at most MaxInFlight requests in flight at once for what
	// this node matches, across every replica, beside or instead of its rate limits. A request
	// holds a slot named by its descriptor's rls_slot entry (for Envoy, x-request-id) until a
	// descriptor with the same entries and an rls_release entry releases it, or until the slot's
	// lifetime ends. See docs/concurrency.md.
	Concurrency *Concurrency `yaml:"concurrency"`
	// Descriptors are the children, matched against the next entry.
	Descriptors []Descriptor `yaml:"descriptors"`
	// ShadowMode evaluates and reports the limit but never denies because of it: the descriptor's
	// status is OK and nothing is charged when it would have been over.
	ShadowMode bool `yaml:"shadow_mode"`
	// QuotaMode makes the limit a soft quota: a descriptor over its quota reports OVER_LIMIT, but
	// the request is denied only when every quota-mode descriptor of the request is over (or an
	// ordinary limit denies). The indices of exceeded quotas go to the response's dynamic metadata.
	QuotaMode bool `yaml:"quota_mode"`
	// DetailedMetric puts the request's descriptor values in metric labels for this rule.
	DetailedMetric bool `yaml:"detailed_metric"`
	// ValueToMetric puts the matched entry's value (instead of the rule's pattern) in metric labels.
	ValueToMetric bool `yaml:"value_to_metric"`
	// ShareThreshold, on a wildcard node, makes every value the wildcard matches share one bucket
	// instead of one bucket per value.
	ShareThreshold bool `yaml:"share_threshold"`
	// Metadata is copied into the response's dynamic_metadata, under the key "metadata", when
	// this descriptor passes (its limit allows it, or the rule is in shadow mode); where several
	// descriptors' rules set a key, the first descriptor's value wins (objects merge key by key).
	Metadata map[string]any `yaml:"metadata"`
	// FailureMode overrides the server's --failure-mode for this rule when the backend fails:
	// "allow", "deny", "error" or "local". Empty means the server's default.
	FailureMode string `yaml:"failure_mode"`
}

// RateLimit is one limit: RequestsPerUnit requests per UnitMultiplier units of time, with a burst.
type RateLimit struct {
	// Unit is one of second, minute, hour, day, week, month (30 days) or year (365 days), in any
	// case. Required unless Unlimited. Under algorithm fixed_window, windows align to the clock:
	// a week starts on Monday, and a month or a year is a calendar month or year.
	Unit string `yaml:"unit"`
	// RequestsPerUnit is the sustained rate, a whole number (0.5 is an error, not 0). 0 denies
	// every request.
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	// Unlimited admits everything and reports no limit. A unit must not be set with it.
	Unlimited bool `yaml:"unlimited"`
	// Name identifies the limit in responses (RateLimit.name), metrics and replaces lists.
	Name string `yaml:"name"`
	// Replaces lists limits, by name, that this limit drops from the same request when both match.
	Replaces []Replace `yaml:"replaces"`
	// Burst is an rls extension: how many requests may arrive at once after a quiet period (the
	// GCRA tolerance). Defaults to RequestsPerUnit. Independent of the sustained rate.
	Burst *uint32 `yaml:"burst"`
	// UnitMultiplier is an rls extension: the period is UnitMultiplier units (unit: second,
	// unit_multiplier: 30 is 30 seconds). Defaults to 1; must be > 0 when set, and the period
	// no longer than 100 years (limit.MaxTolerance).
	UnitMultiplier *uint32 `yaml:"unit_multiplier"`
	// Overdraft is an rls extension for usage reported after the fact (LLM tokens counted when
	// a response ends): a request's hits are charged even beyond what remains, so the key goes
	// into debt, and every request with hits and every check (hits 0) is denied until the
	// sustained rate has repaid the debt (at most 100 years of it; a debt is forgiven when the
	// rate or period changes). The charge that goes over is answered OVER_LIMIT. It never
	// makes a request's other limits charge: a request that an ordinary limit denies is charged
	// nowhere.
	Overdraft bool `yaml:"overdraft"`
	// Global is an rls extension for deployments in several regions (rls --region): true makes
	// the limit one limit across every region, each region enforcing its share of it from its
	// own Redis; false keeps it per region. Unset, the limit is global when its domain is one of
	// --global-domains. Global applies to algorithm gcra without overdraft.
	Global *bool `yaml:"global"`
	// Algorithm is an rls extension: how requests are counted. "gcra" (the default: a rate with
	// a burst), "fixed_window" (a count per window aligned to the clock, as envoyproxy/ratelimit
	// counts, with calendar months and years), "sliding_window" (the current and the previous
	// window's counts, the previous weighted by its overlap with the last period) or
	// "sliding_log" (the instant of every admitted request: exact, requests_per_unit at most
	// 1,000). Burst applies to gcra only; overdraft to gcra and fixed_window.
	Algorithm string `yaml:"algorithm"`
	// Timezone is an rls extension for fixed_window with unit day, week, month or year: the IANA
	// name ("Europe/Paris") of the zone whose midnights start the windows. Defaults to UTC.
	Timezone string `yaml:"timezone"`
}

// Concurrency is a limit on requests in flight.
type Concurrency struct {
	// MaxInFlight is how many slots may be held at once, 1 to 10,000. Required.
	MaxInFlight uint32 `yaml:"max_in_flight"`
	// SlotLifetime is how long a slot not released stays held ("10m", "90s"): the most a lost
	// release costs. Whole milliseconds, at most 24h. Required.
	SlotLifetime string `yaml:"slot_lifetime"`
}

// Replace names a limit that a RateLimit replaces.
type Replace struct {
	Name string `yaml:"name"`
}
