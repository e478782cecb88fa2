package client_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
)

// TestNewDecision: the decision NewDecision makes of the statuses of rls's answers is the one
// Check made of them, through a burst and past it, with two descriptors (the limiting one
// changes from the key to the user once the key runs out first, and the user's limit denies).
func TestNewDecision(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	c := newClient(t, p.GRPCAddr, client.Options{Timeout: 5 * time.Second})
	var allowed, denied int
	for i := range 6 {
		d, err := c.Check(ctxT(t), client.Desc("user", "u"), client.Desc("api_key", "k"), client.GenericKey("global"))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		} else {
			denied++
		}
		if got := client.NewDecision(d.Statuses...); !reflect.DeepEqual(got, d) {
			t.Errorf("check %d: NewDecision %+v, Check %+v", i, got, d)
		}
	}
	if allowed == 0 || denied == 0 {
		t.Errorf("%d allowed, %d denied: want both", allowed, denied)
	}
	if d := client.NewDecision(); !d.Allowed || d.Descriptor != nil {
		t.Errorf("no statuses: %+v, want allowed without a limit", d)
	}
}

// TestFailurePolicyAnswer: Answer is what Check returns under each policy when rls is down.
func TestFailurePolicyAnswer(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	addr := p.GRPCAddr
	p.Stop(t)
	for _, policy := range []client.FailurePolicy{client.FailAllow, client.FailDeny, client.FailError} {
		d, err := newClient(t, addr, client.Options{OnFailure: policy, Timeout: time.Second}).Check(ctxT(t), client.Desc("api_key", "k"))
		want, wantErr := policy.Answer(d.Err)
		if d.Err == nil || !reflect.DeepEqual(d, want) || (err == nil) != (wantErr == nil) ||
			(err != nil && (err.Error() != wantErr.Error() || !errors.Is(err, client.ErrUnavailable))) {
			t.Errorf("%v: Check %+v, %v; Answer %+v, %v", policy, d, err, want, wantErr)
		}
	}
}
