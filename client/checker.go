package client

import (
	"context"
	"fmt"
	"time"
)

// Checker asks for decisions: what the middleware of packages httplimit and grpclimit call.
// *Client is one; a CheckerFunc is another, to test a handler without a running rls.
type Checker interface {
	Check(ctx context.Context, descs ...Descriptor) (Decision, error)
}

var _ Checker = (*Client)(nil)

// CheckerFunc is a Checker that calls itself, as http.HandlerFunc is a Handler. With
// NewDecision and FailurePolicy.Answer it plays rls's answers and its outages in a test.
type CheckerFunc func(ctx context.Context, descs ...Descriptor) (Decision, error)

// Check calls f.
func (f CheckerFunc) Check(ctx context.Context, descs ...Descriptor) (Decision, error) {
	return f(ctx, descs...)
}

// NewDecision returns the decision rls's answer of statuses makes, as Check returns it: denied
// when any status is over its limit, with the summary fields (Descriptor, Limit, Remaining,
// RetryAfter, Reset) chosen from statuses as for an answer of rls.
func NewDecision(statuses ...Status) Decision {
	d := Decision{Source: SourceRLS, Statuses: statuses}
	over := false
	for _, st := range statuses {
		over = over || st.OverLimit
	}
	d.decide(over)
	return d
}

// Answer returns the decision and error Check returns under p when rls did not answer, with
// cause err: allowed (FailAllow), denied with a RetryAfter of one second (FailDeny), or an
// error wrapping ErrUnavailable (FailError); the decision has Source SourceFailure and Err err.
func (p FailurePolicy) Answer(err error) (Decision, error) {
	d := Decision{Source: SourceFailure, Err: err}
	switch p {
	case FailAllow:
		d.Allowed = true
	case FailDeny:
		d.RetryAfter = time.Second
	case FailError:
		return d, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return d, nil
}
