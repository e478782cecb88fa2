package xds_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/xds"
	"github.com/rls-project/rls/internal/xdstest"
)

func config(name, domain string, perMinute uint32, unit rlconfv3.RateLimitUnit) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "k", Value: "v", RateLimit: &rlconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: perMinute, Name: "kv"},
			Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "inner", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}}}},
	}}
}

// rulesHolder applies snapshots as rls does: all or nothing.
type rulesHolder struct {
	mu    sync.Mutex
	rules *descriptors.RuleSet
	n     int
}

func (h *rulesHolder) apply(cs []*rlconfv3.RateLimitConfig) error {
	rs, err := xds.Rules(cs, descriptors.Options{})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.rules, h.n = rs, h.n+1
	h.mu.Unlock()
	return nil
}

func (h *rulesHolder) limit(domain string) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rules.Match(domain, []descriptors.Entry{{Key: "k", Value: "v"}})
	if r == nil || len(r.Limits) == 0 {
		return 0
	}
	return r.Limits[0].RequestsPerUnit
}

func TestSubscription(t *testing.T) {
	srv := xdstest.Start(t, nil)
	srv.Set("other-node", "1", config("x", "other", 99, rlconfv3.RateLimitUnit_MINUTE))
	srv.Set("rls-node", "1", config("a", "d", 10, rlconfv3.RateLimitUnit_MINUTE))
	h := &rulesHolder{}
	c, err := xds.New(xds.Options{Server: srv.Addr, NodeID: "rls-node", Headers: map[string]string{"x-token": "t1"},
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Apply: h.apply})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	srv.WaitACK("1", 10*time.Second)
	if got := h.limit("d"); got != 10 {
		t.Fatalf("limit after version 1: %d, want 10", got)
	}
	if got := h.limit("other"); got != 0 {
		t.Fatalf("another node's snapshot was applied")
	}
	if _, mds := srv.Streams(); len(mds) == 0 || strings.Join(mds[0].Get("x-token"), "") != "t1" {
		t.Errorf("stream metadata %v, want x-token t1", mds)
	}

	srv.Set("rls-node", "2", config("a", "d", 20, rlconfv3.RateLimitUnit_MINUTE))
	srv.WaitACK("2", 10*time.Second)
	if got := h.limit("d"); got != 20 {
		t.Fatalf("limit after version 2: %d, want 20", got)
	}

	// An invalid snapshot is NACKed with the loader's reason, and the rules in force stay.
	before := len(srv.Replies())
	srv.Set("rls-node", "3", config("a", "d", 30, rlconfv3.RateLimitUnit_UNKNOWN))
	nack := srv.WaitNACK(before, 10*time.Second)
	if !strings.Contains(nack.Error, "xds:a:") || !strings.Contains(nack.Error, "unit") {
		t.Errorf("NACK %q, want the resource name and the bad unit", nack.Error)
	}
	if nack.Version != "2" {
		t.Errorf("NACK keeps version %q, want 2", nack.Version)
	}
	if got := h.limit("d"); got != 20 {
		t.Fatalf("limit after the invalid version 3: %d, want 20 still", got)
	}

	// The server goes away and comes back: the client subscribes again and gets its state.
	srv.Stop()
	srv.Set("rls-node", "4", config("a", "d", 40, rlconfv3.RateLimitUnit_MINUTE))
	srv.Restart()
	srv.WaitACK("4", 10*time.Second)
	if got := h.limit("d"); got != 40 {
		t.Fatalf("limit after the restart: %d, want 40", got)
	}
	if n, _ := srv.Streams(); n < 2 {
		t.Errorf("%d streams, want a second one after the restart", n)
	}
}

func TestRulesFromConfigs(t *testing.T) {
	two := []*rlconfv3.RateLimitConfig{config("a", "d", 10, rlconfv3.RateLimitUnit_SECOND), config("b", "d", 5, rlconfv3.RateLimitUnit_HOUR)}
	if _, err := xds.Rules(two, descriptors.Options{}); err == nil || !strings.Contains(err.Error(), "duplicate domain") {
		t.Errorf("two configs of one domain: %v, want duplicate domain", err)
	}
	two[1].Descriptors[0].Value = "w"
	rs, err := xds.Rules(two, descriptors.Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]uint32{"v": 10, "w": 5} {
		r := rs.Match("d", []descriptors.Entry{{Key: "k", Value: v}})
		if r == nil || r.Limits[0].RequestsPerUnit != want {
			t.Errorf("k=%s: %+v, want %d", v, r, want)
		}
	}
	r := rs.Match("d", []descriptors.Entry{{Key: "k", Value: "v"}, {Key: "inner", Value: "x"}})
	if r == nil || !r.Unlimited {
		t.Errorf("nested unlimited: %+v", r)
	}
	if _, err := xds.Rules([]*rlconfv3.RateLimitConfig{{Name: "e", Domain: ""}}, descriptors.Options{}); err == nil || !strings.Contains(err.Error(), "xds:e:") {
		t.Errorf("empty domain: %v, want an error naming xds:e", err)
	}
}

// TestRulesHostileConfigs: values YAML would misread are carried as data, and what the loader
// rejects comes back as an error naming the resource, never a panic.
func TestRulesHostileConfigs(t *testing.T) {
	// JSON leaves DEL, the C1 controls and U+FFFE/U+FFFF unescaped, YAML does not allow them so.
	odd := "a: b\n- c # \"d\" 'e' {f} [g] &h *i !j %k @l `m` \x00 \x7f \u0085 \u009f \ufffe \uffff"
	c := &rlconfv3.RateLimitConfig{Name: "odd", Domain: odd, Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: odd, Value: odd, RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}},
	}}
	rs, err := xds.Rules([]*rlconfv3.RateLimitConfig{c}, descriptors.Options{})
	if err != nil {
		t.Fatalf("odd characters: %v", err)
	}
	if r := rs.Match(odd, []descriptors.Entry{{Key: odd, Value: odd}}); r == nil {
		t.Error("a key and value with YAML syntax in them did not round-trip")
	}
	deep := &rlconfv3.RateLimitDescriptor{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}
	for range limit.MaxEntries + 5 {
		deep = &rlconfv3.RateLimitDescriptor{Key: "k", Descriptors: []*rlconfv3.RateLimitDescriptor{deep}}
	}
	_, err = xds.Rules([]*rlconfv3.RateLimitConfig{{Name: "deep", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{deep}}}, descriptors.Options{})
	if err == nil || !strings.Contains(err.Error(), "xds:deep:") || !strings.Contains(err.Error(), "deeper") {
		t.Errorf("nesting past limit.MaxEntries: %v", err)
	}
}
