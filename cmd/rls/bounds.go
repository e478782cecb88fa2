package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/service"
)

// boundsConfig holds the flags bounding what a client's requests may make rls hold or do.
type boundsConfig struct {
	maxRequestBytes   int
	maxInflightBytes  int64
	overrides         string
	overrideMaxPeriod time.Duration
	maxCalls          int64
}

func boundsFlags(fs *flag.FlagSet) *boundsConfig {
	b := &boundsConfig{}
	fs.IntVar(&b.maxRequestBytes, "max-request-bytes", service.DefaultMaxRequestBytes,
		"largest request accepted, as a gRPC message (answered RESOURCE_EXHAUSTED before it is read) or a POST /json body (413); Envoy's requests take a few hundred bytes")
	fs.Int64Var(&b.maxInflightBytes, "max-inflight-bytes", service.DefaultMaxInflightBytes,
		"memory the requests being decided may hold at once (each counted by its descriptors and bytes, about 1.5 KiB for a typical Envoy request); a request past it is shed through the failure mode and counted in rls_inflight_shed_total; 0: no bound")
	fs.StringVar(&b.overrides, "overrides", "allow",
		"what a descriptor's limit override does: allow (decided by its own limit, in state of its own), ignore (decided by the rules as if it carried none) or refuse (the request is answered PERMISSION_DENIED)")
	fs.DurationVar(&b.overrideMaxPeriod, "override-max-period", time.Duration(limit.Year.Seconds())*time.Second,
		"longest period (unit × multiplier) an override may ask for; longer ones are answered INVALID_ARGUMENT (0: any)")
	callLimitFlags(fs, &b.maxCalls)
	return b
}

func (b *boundsConfig) validate() error {
	switch {
	case b.maxRequestBytes < 1024:
		return fmt.Errorf("%w: --max-request-bytes %d: want at least 1024", errUsage, b.maxRequestBytes)
	case b.maxInflightBytes < 0:
		return fmt.Errorf("%w: --max-inflight-bytes %d: want ≥ 0", errUsage, b.maxInflightBytes)
	case b.overrideMaxPeriod < 0:
		return fmt.Errorf("%w: --override-max-period %v: want ≥ 0", errUsage, b.overrideMaxPeriod)
	}
	if _, err := b.overridePolicy(); err != nil {
		return err
	}
	return nil
}

func (b *boundsConfig) overridePolicy() (service.OverridePolicy, error) {
	p := service.OverridePolicy{MaxPeriod: b.overrideMaxPeriod}
	switch b.overrides {
	case "allow":
	case "ignore":
		p.Ignore = true
	case "refuse":
		p.Refuse = true
	default:
		return p, fmt.Errorf("%w: --overrides %q: want allow, ignore or refuse", errUsage, b.overrides)
	}
	return p, nil
}
