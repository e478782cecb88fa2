package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/rls-project/rls/internal/backend"
	redisbackend "github.com/rls-project/rls/internal/backend/redis"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/regions"
)

// RegionsConfig is one limit across regions: this replica's region, the coordination store
// and which limits are global (see package regions and docs/multi-region.md).
type RegionsConfig struct {
	Region        string        // --region; "": one region, as before
	GlobalURL     string        // --global-url
	GlobalDomains string        // --global-domains, comma-separated
	Safe          string        // --global-safe-share: zero, fair or last
	Regions       int           // --global-regions: N of the fair share
	Interval      time.Duration // --global-interval
	Lease         time.Duration // --global-lease
	TableLease    time.Duration // --global-table-lease
	Margin        time.Duration // --global-margin
	MaxKeys       int           // --global-max-keys
}

// domains is --global-domains as a list.
func (rc RegionsConfig) domains() []string {
	var out []string
	for _, d := range strings.Split(rc.GlobalDomains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

func (c Config) validateRegions() error {
	rc := c.Regions
	if rc.Region == "" {
		if rc.GlobalURL != "" || rc.GlobalDomains != "" {
			return errors.New("--global-url and --global-domains need --region: name this replica's region")
		}
		return nil
	}
	var errs []error
	if strings.ContainsAny(rc.Region, " {}:,") {
		errs = append(errs, fmt.Errorf("--region %q: want a name without spaces, braces, colons or commas", rc.Region))
	}
	if c.Backend != "redis" {
		errs = append(errs, fmt.Errorf("--region needs --backend redis: a region's replicas decide from the region's Redis (--backend %s)", c.Backend))
	}
	if rc.GlobalURL == "" {
		errs = append(errs, errors.New("--region needs --global-url: the coordination store every region reaches"))
	} else if _, err := redisbackend.ParseURL(rc.GlobalURL); err != nil {
		errs = append(errs, fmt.Errorf("--global-url: %w", err))
	}
	safe, err := regions.ParseSafe(rc.Safe)
	if err != nil {
		errs = append(errs, fmt.Errorf("--global-safe-share: %w", err))
	}
	if safe == regions.SafeFair && rc.Regions < 1 {
		errs = append(errs, fmt.Errorf("--global-safe-share fair needs --global-regions: the number of regions the limit is split among (%d)", rc.Regions))
	}
	for name, d := range map[string]time.Duration{"--global-interval": rc.Interval, "--global-lease": rc.Lease,
		"--global-table-lease": rc.TableLease, "--global-margin": rc.Margin} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a positive duration", name, d))
		}
	}
	if rc.MaxKeys < 1 {
		errs = append(errs, fmt.Errorf("--global-max-keys %d: want at least 1", rc.MaxKeys))
	}
	if rc.TableLease <= 2*c.Redis.Timeout {
		errs = append(errs, fmt.Errorf("--global-table-lease %v: want more than twice --redis-timeout (%v), a decision's longest", rc.TableLease, c.Redis.Timeout))
	}
	if rc.Lease < 2*rc.TableLease+rc.Margin {
		errs = append(errs, fmt.Errorf("--global-lease %v: want at least twice --global-table-lease (%v) plus --global-margin (%v)", rc.Lease, rc.TableLease, rc.Margin))
	}
	return errors.Join(errs...)
}

// startRegions starts this replica's part of the limits across regions, when --region names one:
// decisions on global limits then use the region's share of them.
func startRegions(c Config, b backend.Backend, log *slog.Logger) (*regions.Node, error) {
	rc := c.Regions
	if rc.Region == "" {
		return nil, nil
	}
	rb, ok := b.(*redisbackend.Backend)
	if !ok {
		return nil, errors.New("--region needs --backend redis")
	}
	global, err := redisClient(rc.GlobalURL, c.Redis, "--global-url")
	if err != nil {
		return nil, err
	}
	local, err := redisClient(c.Redis.URL, c.Redis, "--redis-url")
	if err != nil {
		global.Close()
		return nil, err
	}
	safe, _ := regions.ParseSafe(rc.Safe)
	n, err := regions.Start(regions.Config{
		Region: rc.Region, Global: global, Local: local, Policy: regions.Policy{Safe: safe, Regions: rc.Regions}, Regions: rc.Regions,
		MaxKeys: rc.MaxKeys, DecisionBudget: c.Redis.Timeout,
		Interval: rc.Interval, Lease: rc.Lease, TableLease: rc.TableLease, Margin: rc.Margin,
		Prefix: c.Redis.KeyPrefix, Logger: log.With("component", "regions"),
		Charge: func(ctx context.Context, key string, l limit.Limit, cost int64) error {
			out := make([]backend.Decision, 1)
			_, err := rb.Decide(ctx, []backend.Request{{Key: key, Limit: l, Cost: cost}}, out)
			return err
		},
	})
	if err != nil {
		global.Close()
		local.Close()
		return nil, err
	}
	rb.SetShares(n)
	log.Info("global limits across regions", "region", rc.Region, "global", redisbackend.RedactURL(rc.GlobalURL),
		"global_domains", rc.GlobalDomains, "safe_share", rc.Safe, "interval", rc.Interval, "lease", rc.Lease)
	return n, nil
}
