package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"
)

// The descriptor entries of rls's limits on requests in flight (a rule's concurrency field; see
// rls's docs/concurrency.md): the slot's id, and the mark of a release.
const (
	SlotEntry    = "rls_slot"
	ReleaseEntry = "rls_release"
)

// Acquirer is a Checker that can also hold a slot of concurrency limits for the time a request
// runs: what the middleware of packages httplimit and grpclimit call with Options.InFlight.
// *Client is one.
type Acquirer interface {
	Checker
	// Acquire asks as Check does, holding for the request one slot of every concurrency limit
	// its descriptors match. release frees them; it is never nil, may be called more than once
	// (the first call releases), and must be called when the request ends, whatever Acquire
	// returned.
	Acquire(ctx context.Context, descs ...Descriptor) (d Decision, release func(), err error)
}

var _ Acquirer = (*Client)(nil)

// noRelease is the release of an acquire that holds nothing.
func noRelease() {}

// Acquire asks whether a request described by descs is admitted, as Check does (one hit to
// each descriptor's rate limits), and holds one slot of every concurrency limit its descriptors
// match, named by a random id sent as the SlotEntry entry of each descriptor. The local tier
// is not asked. release sends the same descriptors with ReleaseEntry, once, within
// Options.Timeout and whatever ctx has become; its answer is ignored. A release that does not
// reach rls leaves the slots held until their slot_lifetime ends.
//
// Errors are Check's. When rls did not answer, release is sent all the same (the acquire may
// have reached rls); when rls denied the request, release does nothing.
func (c *Client) Acquire(ctx context.Context, descs ...Descriptor) (Decision, func(), error) {
	if err := validate(descs); err != nil {
		return Decision{}, noRelease, err
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Decision{}, noRelease, fmt.Errorf("client: slot id: %w", err)
	}
	id := hex.EncodeToString(raw[:])
	slotted, rel := make([]Descriptor, len(descs)), make([]Descriptor, len(descs))
	for i, d := range descs {
		slotted[i] = d.With(SlotEntry, id)
		rel[i] = slotted[i].With(ReleaseEntry, "1")
	}
	if err := validate(rel); err != nil {
		return Decision{}, noRelease, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, noRelease, fmt.Errorf("client: %w", err)
	}
	callCtx, cancel := context.WithTimeout(ctx, c.callTimeout(ctx))
	defer cancel()
	resp, err := c.rls.ShouldRateLimit(callCtx, request(c.domain, 1, slotted))
	if err != nil {
		d, err := c.failed(ctx, err)
		return d, c.releaser(rel), err
	}
	d := decision(descs, resp)
	if !d.Allowed {
		return d, noRelease, nil
	}
	return d, c.releaser(rel), nil
}

// callTimeout is the time a call to rls asked with ctx may take.
func (c *Client) callTimeout(ctx context.Context) time.Duration {
	timeout := c.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl)/4)
	}
	return timeout
}

// releaser returns the release that sends rel, an acquire's descriptors with ReleaseEntry.
func (c *Client) releaser(rel []Descriptor) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			_, _ = c.rls.ShouldRateLimit(ctx, request(c.domain, 1, rel))
		})
	}
}
