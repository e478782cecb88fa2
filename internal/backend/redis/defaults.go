package redis

import "time"

// The defaults of Options, which New applies to a field left zero and the server's
// configuration (its flags' defaults) names.
const (
	DefaultDialTimeout       = time.Second            // Options.DialTimeout
	DefaultReadTimeout       = time.Second            // Options.ReadTimeout
	DefaultTimeout           = 50 * time.Millisecond  // Options.Timeout
	DefaultKeyPrefix         = "rls:"                 // Options.KeyPrefix
	DefaultCoalescePipelines = 1                      // Options.CoalescePipelines
	DefaultBreakerFailures   = 5                      // Options.BreakerFailures
	DefaultBreakerCooldown   = 500 * time.Millisecond // Options.BreakerCooldown
	DefaultProbeTimeout      = time.Second            // Options.ProbeTimeout
	DefaultHealthInterval    = time.Second            // Options.HealthInterval
)
