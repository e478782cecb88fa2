package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
)

// ruleEditRules is generation gen of the rule file of TestRuleEditKeepsState: the user's
// limits (limits, the items of its rate_limits list), and a probe whose rate names the
// generation, so that the test knows when a reload is in force.
func ruleEditRules(domain string, gen int, limits ...string) string {
	s := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: gen\n    rate_limit: {unit: second, requests_per_unit: %d, burst: 1000000}\n  - key: user\n    rate_limits:\n", domain, 1000+gen)
	for _, l := range limits {
		s += "      - " + l + "\n"
	}
	return s
}

const (
	perSecond = "{unit: second, requests_per_unit: 10, burst: 10}"
	perDay    = "{unit: day, requests_per_unit: 20}"
)

// TestRuleEditKeepsState: a rule's limits keep their own state when the rule file is edited,
// whatever their place in the rate_limits list. With rate_limits [10/s burst 10, 20/day]:
//   - the daily 20 spent, a reload that removes the per-second limit admits nothing more on
//     the spent daily quota;
//   - 15 of the daily 20 spent and the per-second limit full again, a reload that swaps the
//     two leaves the per-second limit admitting at 5/s: of 20 requests at 5/s, the 5 the day
//     has left are admitted, and every denial is the day's, none the per-second limit's.
//
// Through the real binary, its rules reloaded by SIGHUP, on the memory backend and on Redis.
func TestRuleEditKeepsState(t *testing.T) {
	t.Parallel()
	url := redistest.URL(t, redistest.SingleEnv)
	for _, backend := range []string{"memory", "redis"} {
		for _, edit := range []string{"remove", "swap"} {
			t.Run(backend+"/"+edit, func(t *testing.T) {
				t.Parallel()
				domain := fmt.Sprintf("ruleedit-%s-%s-%d", backend, edit, time.Now().UnixNano())
				dir := t.TempDir()
				file := filepath.Join(dir, "rules.yaml")
				write := func(content string) {
					t.Helper()
					tmp := filepath.Join(dir, ".rules.yaml.tmp")
					if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(tmp, file); err != nil {
						t.Fatal(err)
					}
				}
				write(ruleEditRules(domain, 0, perSecond, perDay))
				args := []string{"--config", dir, "--reload-debounce", "50ms"}
				if backend == "redis" {
					args = append(args, "--backend", "redis", "--redis-url", url, "--redis-key-prefix", domain+":", "--redis-timeout", "5s")
				}
				p := startRLS(t, nil, args...)
				client := p.client(t)
				ask := func() *rlsv3.RateLimitResponse_DescriptorStatus {
					t.Helper()
					resp, err := client.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{
						Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("user", "u1")},
					})
					if err != nil {
						t.Fatal(err)
					}
					return resp.GetStatuses()[0]
				}
				// spend charges n hits, as fast as the per-second limit admits them.
				spend := func(n int) {
					t.Helper()
					deadline := time.Now().Add(10 * time.Second)
					for admitted := 0; admitted < n; {
						st := ask()
						if st.GetCode() == rlsv3.RateLimitResponse_OK {
							admitted++
							continue
						}
						if u := st.GetCurrentLimit().GetUnit(); u != rlsv3.RateLimitResponse_RateLimit_SECOND {
							t.Fatalf("%d of %d spent: denied by the %v limit, want only the per-second one to deny", admitted, n, u)
						}
						if time.Now().After(deadline) {
							t.Fatalf("only %d of %d admitted in 10s", admitted, n)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
				reload := func(content string) {
					t.Helper()
					write(content)
					p.Signal(t, syscall.SIGHUP)
					deadline := time.Now().Add(10 * time.Second)
					for {
						resp, err := client.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{
							Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("gen", "x")},
						})
						if err != nil {
							t.Fatal(err)
						}
						if resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 1001 {
							return
						}
						if time.Now().After(deadline) {
							t.Fatalf("the edited rules were not in force 10s after SIGHUP\n%s", p.Output())
						}
						time.Sleep(5 * time.Millisecond)
					}
				}

				switch edit {
				case "remove":
					spend(20)
					if st := ask(); st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
						t.Fatalf("the daily 20 spent: %v, want OVER_LIMIT", st)
					}
					reload(ruleEditRules(domain, 1, perDay))
					admitted := 0
					for range 30 {
						if ask().GetCode() == rlsv3.RateLimitResponse_OK {
							admitted++
						}
					}
					t.Logf("%s: the daily 20 spent, then the per-second limit removed: %d of 30 more admitted", backend, admitted)
					if admitted > 0 {
						t.Errorf("%d more admitted on the spent daily quota after the per-second limit was removed, want 0", admitted)
					}
				case "swap":
					spend(15)
					time.Sleep(1100 * time.Millisecond) // the per-second limit full again
					reload(ruleEditRules(domain, 1, perDay, perSecond))
					admitted, bySecond := 0, 0
					tick := time.NewTicker(200 * time.Millisecond) // 5/s, half the per-second rate
					defer tick.Stop()
					for i := range 20 {
						if i > 0 {
							<-tick.C
						}
						st := ask()
						switch {
						case st.GetCode() == rlsv3.RateLimitResponse_OK:
							admitted++
						case st.GetCurrentLimit().GetUnit() == rlsv3.RateLimitResponse_RateLimit_SECOND:
							bySecond++
						}
					}
					t.Logf("%s: 5 of the daily 20 left, then the two limits swapped: %d of 20 at 5/s admitted, %d denied by the per-second limit", backend, admitted, bySecond)
					if admitted != 5 || bySecond > 0 {
						t.Errorf("%d of 20 at 5/s admitted, %d denied by the per-second limit: want the 5 the day has left admitted and none denied by the per-second limit",
							admitted, bySecond)
					}
				}
			})
		}
	}
}
