package service

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
)

// The descriptor entries of limits on requests in flight (a rule's concurrency): neither is
// matched against the rules nor part of a key.
const (
	// SlotEntry's value names the slot a request holds: for Envoy, its x-request-id.
	SlotEntry = "rls_slot"
	// ReleaseEntry, with any value, makes the descriptor release its slot instead of acquiring
	// it: for Envoy, a generic_key of a rate_limits action with apply_on_stream_done. A release
	// is charged to no rate limit of its rule.
	ReleaseEntry = "rls_release"
)

// takeSlotEntries records the slot entries of a request descriptor's entries in ds and returns
// matched (its entries as the rules match them) without them; ds.plain is then the entries
// without them, for its keys.
func (ds *descState) takeSlotEntries(entries []*ratelimitv3.RateLimitDescriptor_Entry, matched []descriptors.Entry) []descriptors.Entry {
	found := false
	for _, e := range entries {
		if k := e.GetKey(); k == SlotEntry || k == ReleaseEntry {
			found = true
			break
		}
	}
	if !found {
		return matched
	}
	ds.plain = make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, len(entries))
	matched = matched[:0]
	for _, e := range entries {
		switch e.GetKey() {
		case SlotEntry:
			ds.slot = e.GetValue()
		case ReleaseEntry:
			ds.release = true
		default:
			ds.plain = append(ds.plain, e)
			matched = append(matched, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	return matched
}

// slotRequest completes req, one limit of the descriptor ds, for its slot entries: a
// concurrency limit acquires the descriptor's slot, or releases it; a rate limit of a release
// is not decided (false). A slot is never a soft quota.
func (ds *descState) slotRequest(req *backend.Request) bool {
	if req.Limit.Algorithm != limit.Concurrency {
		return !ds.release
	}
	req.Slot = ds.slot
	if ds.release {
		req.Refund, req.Cost = true, 1
	}
	if req.Mode == backend.Quota {
		req.Mode = backend.Enforce
	}
	return true
}

// counted is d as metrics and statistics count it: without its slot entries, so that a slot id
// never becomes a label value (detailed_metric).
func (ds *descState) counted(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	if ds.plain == nil {
		return d
	}
	return &ratelimitv3.RateLimitDescriptor{Entries: ds.plain, Limit: d.GetLimit(), HitsAddend: d.GetHitsAddend()}
}
