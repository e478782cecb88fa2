package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/xdstest"
)

// Envoy AI Gateway's QuotaPolicy service: its controller serves RateLimitConfig over xDS SotW
// (port 18002) to the node envoy-ai-gateway-ratelimit, all in the domain ai-gateway-quota, and
// its Envoy asks the rate-limit service at envoy-ai-gateway-ratelimit:8081 at request time and
// again, with the tokens used as hits_addend, when the stream is done (apply_on_stream_done).
const (
	aigNodeID  = "envoy-ai-gateway-ratelimit"
	aigDomain  = "ai-gateway-quota"
	aigBackend = "default/openai" // backend_name: the AIServiceBackend's namespace/name
)

// aigQuota is a leaf as the controller's translator (internal/ratelimit/translator) writes it:
// the limit, in quota mode.
func aigQuota(key, value string, perUnit uint32) *rlconfv3.RateLimitDescriptor {
	return &rlconfv3.RateLimitDescriptor{Key: key, Value: value, QuotaMode: true,
		RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: perUnit}}
}

// aigConfig is the RateLimitConfig the controller builds for one QuotaPolicy on aigBackend:
// per-model quotas for gpt-4 (10 tokens an hour, no bucket rules) and claude (a bucket rule
// for the client header x-tenant: acme, 1000 an hour, and a default bucket of 10 an hour), and,
// with serviceQuota > 0, a service quota for every other model.
func aigConfig(serviceQuota uint32) *rlconfv3.RateLimitConfig {
	models := []*rlconfv3.RateLimitDescriptor{
		aigQuota("model_name_override", "gpt-4", 10),
		{Key: "model_name_override", Value: "claude", Descriptors: []*rlconfv3.RateLimitDescriptor{
			aigQuota("rule-0-x-tenant|acme-match-0", "rule-0-x-tenant|acme-match-0", 1000),
			aigQuota("rule-1-match--1", "rule-1-match--1", 10),
		}},
	}
	if serviceQuota > 0 {
		models = append(models, aigQuota("model_name_override", "", serviceQuota))
	}
	return &rlconfv3.RateLimitConfig{Name: aigDomain, Domain: aigDomain, Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "backend_name", Value: aigBackend, Descriptors: models},
	}}
}

// aigDesc is one descriptor as the route's rate-limit actions build it: backend_name and
// model_name_override, then any bucket rule's entry (key and value alike, from a header match
// or the default bucket's generic key). cost < 0: a request-time descriptor, which carries no
// hits_addend (so the request's, 0, meaning 1, applies); else a stream-done descriptor whose
// hits_addend is the quota cost ext_proc put in the dynamic metadata.
func aigDesc(model string, cost int64, buckets ...string) *ratelimitv3.RateLimitDescriptor {
	kv := []string{"backend_name", aigBackend, "model_name_override", model}
	for _, b := range buckets {
		kv = append(kv, b, b)
	}
	desc := d(kv...)
	if cost >= 0 {
		desc.HitsAddend = wrapperspb.UInt64(uint64(cost))
	}
	return desc
}

// TestAIGatewayQuotaPolicy runs rls as the QuotaPolicy service against a go-control-plane xDS
// server playing the AI gateway controller, and a real Redis: started with the environment the
// AI gateway's manifests give envoyproxy/ratelimit, and with rls's own flags. It sends what
// Envoy sends: a check per request, the tokens charged at stream done. A budget runs out after
// the charged cost and the next request is denied; bucket rules in quota mode deny only when
// every bucket is spent; an update from the xDS server takes effect, and so does the removal of
// every rule.
func TestAIGatewayQuotaPolicy(t *testing.T) {
	for _, how := range []string{"ratelimit environment", "rls flags"} {
		t.Run(how, func(t *testing.T) {
			r := redistest.Start(t)
			xs := xdstest.StartAsAIGateway(t)
			var p *rlsProc
			if how == "ratelimit environment" {
				// As the AI gateway's QuotaPolicy manifests deploy envoyproxy/ratelimit
				// (tests/e2e/testdata/backend_quota_ratelimit.yaml), with the xDS server and
				// Redis here, and RLS_OVERDRAFT: costs reported past the budget are charged.
				// The harness's --grpc-addr on port 0 wins over GRPC_PORT=8081.
				p = launchRLS(t, []string{"LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr(),
					"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "USE_STATSD=false",
					"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID=" + aigNodeID, "CONFIG_GRPC_XDS_SERVER_URL=" + xs.Addr,
					"GRPC_PORT=8081", "RLS_OVERDRAFT=true"})
			} else {
				p = launchRLS(t, nil, "--xds-server", xs.Addr, "--xds-node-id", aigNodeID,
					"--backend", "redis", "--redis-url", "redis://"+r.Addr(), "--overdraft")
			}
			c := p.client(t)
			ask := func(descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
				t.Helper()
				resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: aigDomain, Descriptors: descs})
				if err != nil {
					t.Fatalf("ShouldRateLimit: %v\n%s", err, p.Output())
				}
				return resp
			}

			// Until the controller has sent its rules, rls is not ready.
			if code, body := get(t, "http://"+p.HTTPAddr+"/healthcheck"); code == 200 {
				t.Fatalf("/healthcheck before any rules: %d %q, want not ready", code, body)
			}
			xs.Set(aigNodeID, "1", aigConfig(0))
			xs.WaitACK("1", 20*time.Second)
			p.WaitReady(t)

			// gpt-4, 10 tokens an hour: each request's check costs 1, and its tokens are
			// charged at stream done.
			steps := []struct {
				what      string
				desc      *ratelimitv3.RateLimitDescriptor
				code      rlsv3.RateLimitResponse_Code
				remaining uint32
			}{
				{"request 1", aigDesc("gpt-4", -1), rlsv3.RateLimitResponse_OK, 9},
				{"request 1 done, 5 tokens", aigDesc("gpt-4", 5), rlsv3.RateLimitResponse_OK, 4},
				{"request 2", aigDesc("gpt-4", -1), rlsv3.RateLimitResponse_OK, 3},
				// Past the budget: charged all the same (the answer is not read by Envoy).
				{"request 2 done, 20 tokens", aigDesc("gpt-4", 20), rlsv3.RateLimitResponse_OVER_LIMIT, 0},
				{"request 3", aigDesc("gpt-4", -1), rlsv3.RateLimitResponse_OVER_LIMIT, 0},
			}
			for _, s := range steps {
				resp := ask(s.desc)
				st := resp.GetStatuses()[0]
				if resp.GetOverallCode() != s.code || st.GetLimitRemaining() != s.remaining ||
					st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
					t.Fatalf("gpt-4, %s: %v, want %s with %d remaining of 10 an hour", s.what, resp, s.code, s.remaining)
				}
			}

			// claude: a request from tenant acme counts against its bucket and the default
			// bucket, both in quota mode. 30 tokens spend the default bucket's 10; acme's
			// requests go on (one of its two buckets has quota), others' are denied.
			acme := func(cost int64) []*ratelimitv3.RateLimitDescriptor {
				return []*ratelimitv3.RateLimitDescriptor{aigDesc("claude", cost, "rule-0-x-tenant|acme-match-0"), aigDesc("claude", cost, "rule-1-match--1")}
			}
			if resp := ask(acme(-1)...); codes_(resp) != "OK OK OK" {
				t.Fatalf("claude, acme's first request: %v", resp)
			}
			ask(acme(30)...)
			if resp := ask(acme(-1)...); codes_(resp) != "OK OK OVER_LIMIT" || resp.GetStatuses()[0].GetLimitRemaining() != 1000-1-30-1 {
				t.Fatalf("claude, acme's request after 30 tokens: %v, want admitted by its own bucket (%d left) with the default bucket spent", resp, 1000-1-30-1)
			}
			if resp := ask(aigDesc("claude", -1, "rule-1-match--1")); codes_(resp) != "OVER_LIMIT OVER_LIMIT" {
				t.Fatalf("claude, another tenant's request: %v, want the default bucket spent", resp)
			}

			// A model with no quota of its own is not limited until the controller adds a
			// service quota (3 an hour); then it is, and what was spent stays spent.
			for i := range 4 {
				if resp := ask(aigDesc("gpt-4o-mini", -1)); codes_(resp) != "OK OK" || resp.GetStatuses()[0].GetCurrentLimit() != nil {
					t.Fatalf("gpt-4o-mini before the service quota, request %d: %v, want OK with no limit", i+1, resp)
				}
			}
			xs.Set(aigNodeID, "2", aigConfig(3))
			xs.WaitACK("2", 20*time.Second)
			var got []string
			for range 4 {
				resp := ask(aigDesc("gpt-4o-mini", -1))
				got = append(got, fmt.Sprintf("%s/%d", resp.GetOverallCode(), resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()))
			}
			if strings.Join(got, " ") != "OK/3 OK/3 OK/3 OVER_LIMIT/3" {
				t.Fatalf("gpt-4o-mini under the service quota of 3 an hour: %v", got)
			}
			if resp := ask(aigDesc("gpt-4", -1)); codes_(resp) != "OVER_LIMIT OVER_LIMIT" {
				t.Fatalf("gpt-4 after the update: %v, want its spent budget kept", resp)
			}
			// The last QuotaPolicy deleted: the controller serves no RateLimitConfig, and
			// nothing is limited.
			xs.Set(aigNodeID, "3")
			xs.WaitACK("3", 20*time.Second)
			if resp := ask(aigDesc("gpt-4", -1)); codes_(resp) != "OK OK" || resp.GetStatuses()[0].GetCurrentLimit() != nil {
				t.Fatalf("gpt-4 with no QuotaPolicy left: %v, want OK with no limit", resp)
			}
			if n := redisKeys(t, r.Addr(), "*"); n == 0 {
				t.Error("no key in Redis: the decisions were not made there")
			}
		})
	}
}

// TestAIGatewayBeforeAnyQuotaPolicy: the controller sets no snapshot until a QuotaPolicy is
// reconciled, so without --start-without-rules (FORCE_START_WITHOUT_INITIAL_CONFIG) rls would
// stay not ready; with it rls is ready at once, limits nothing, and limits once rules arrive.
func TestAIGatewayBeforeAnyQuotaPolicy(t *testing.T) {
	xs := xdstest.StartAsAIGateway(t)
	p := startRLS(t, nil, "--xds-server", xs.Addr, "--xds-node-id", aigNodeID, "--backend", "memory",
		"--overdraft", "--start-without-rules")
	c := p.client(t)
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: aigDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{aigDesc("gpt-4", 50)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := ask(); codes_(resp) != "OK OK" || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("before any QuotaPolicy: %v, want OK with no limit", resp)
	}
	xs.Set(aigNodeID, "1", aigConfig(0))
	xs.WaitACK("1", 20*time.Second)
	if resp := ask(); codes_(resp) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("50 tokens on gpt-4's 10 an hour: %v, want OVER_LIMIT", resp)
	}
}
