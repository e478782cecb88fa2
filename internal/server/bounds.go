package server

import (
	"fmt"
	"time"

	"github.com/rls-project/rls/internal/service"
)

// BoundsConfig bounds what a client's requests may make rls hold or do.
type BoundsConfig struct {
	MaxRequestBytes   int           // --max-request-bytes
	MaxInflightBytes  int64         // --max-inflight-bytes; 0: no bound
	Overrides         string        // --overrides: allow, ignore or refuse
	OverrideMaxPeriod time.Duration // --override-max-period; 0: any
	MaxCalls          int64         // --grpc-max-calls; 0: no bound
	// MaxNewKeysPerCaller is --max-new-keys-per-caller: new keys a second one caller may make
	// the backend create, per replica; 0: no bound.
	MaxNewKeysPerCaller int64
}

func (b BoundsConfig) overridePolicy() (service.OverridePolicy, error) {
	p := service.OverridePolicy{MaxPeriod: b.OverrideMaxPeriod}
	switch b.Overrides {
	case "allow":
	case "ignore":
		p.Ignore = true
	case "refuse":
		p.Refuse = true
	default:
		return p, fmt.Errorf("--overrides %q: want allow, ignore or refuse", b.Overrides)
	}
	return p, nil
}
