package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// regionsFlags registers the flags of one limit across regions on fs.
func regionsFlags(fs *flag.FlagSet, rc *server.RegionsConfig) {
	fs.StringVar(&rc.Region, "region", rc.Region,
		"this replica's region, for limits enforced across regions (docs/multi-region.md); every replica of a region shares its Redis. Unset: one region, as without it")
	fs.StringVar(&rc.GlobalURL, "global-url", rc.GlobalURL,
		"--region: the coordination store every region reaches, a Redis URL in any form --redis-url takes (Sentinel for high availability); used every --global-interval, never on a decision")
	fs.StringVar(&rc.GlobalDomains, "global-domains", rc.GlobalDomains,
		"--region: domains whose limits are global across regions, comma-separated (rules from xDS included); a limit's own global: true|false wins. Only gcra limits without overdraft can be global")
	fs.StringVar(&rc.Safe, "global-safe-share", rc.Safe,
		"--region: what a region cut off from the coordination store keeps of each global limit once its lease ends: zero, fair (its share, at most 1/--global-regions) or last (its last share, which no other region gets back while it is cut off)")
	fs.IntVar(&rc.Regions, "global-regions", rc.Regions, "--region: the number of regions: what --global-safe-share fair splits a limit among, and the claims that end a new coordination state's recovery at once (unset: a lease after it began)")
	fs.DurationVar(&rc.Interval, "global-interval", rc.Interval,
		"--region: how often each region reports its demand and shares are divided again (Δ)")
	fs.DurationVar(&rc.Lease, "global-lease", rc.Lease,
		"--region: how long a region applies its shares without hearing from the coordinator; then it falls to --global-safe-share")
	fs.DurationVar(&rc.TableLease, "global-table-lease", rc.TableLease,
		"--region: how long a replica applies the region's table of shares it fetched; a share given up frees this long after it was published")
	fs.IntVar(&rc.MaxKeys, "global-max-keys", rc.MaxKeys,
		"--region: most global keys the region reports and holds shares of; a key asked for beyond them gets no share (its requests are denied) until others are forgotten (rls_global_keys_refused_total)")
	fs.DurationVar(&rc.Margin, "global-margin", rc.Margin,
		"--region: added to a lease before a region's share is given to others, for clocks that run at different rates")
}
