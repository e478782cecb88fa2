package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// algorithmRules mixes the four algorithms, one descriptor key each, under limits that the
// seconds a test takes cannot refill: 3 an hour (gcra: one back every 20 minutes; the sliding
// ones count the last hour) and 3 a year in Tokyo (fixed_window, calendar years).
const algorithmRules = `
domain: algo
descriptors:
  - key: g
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: f
    rate_limit: {unit: year, requests_per_unit: 3, algorithm: fixed_window, timezone: Asia/Tokyo}
  - key: s
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window}
  - key: l
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_log}
`

// TestAlgorithmsAllOrNothing: through the real binary on memory, Redis and Cluster, a request
// with one descriptor under each algorithm is admitted whole or not at all: while any one of
// them is used up, the others report their 3 remaining and nothing is charged; then the request
// is admitted 3 times, every limit counting down together, and refused the fourth.
func TestAlgorithmsAllOrNothing(t *testing.T) {
	rules := writeRules(t, map[string]string{"algo.yaml": algorithmRules})
	keys := []string{"g", "f", "s", "l"}
	for _, be := range usageBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			c := startRLS(t, nil, append([]string{"--config", rules}, be.args(t)...)...).client(t)
			ask := func(values ...string) *rlsv3.RateLimitResponse {
				t.Helper()
				req := &rlsv3.RateLimitRequest{Domain: "algo"}
				for i, v := range values {
					req.Descriptors = append(req.Descriptors, d(keys[i], v))
				}
				resp, err := c.ShouldRateLimit(ctxT(t), req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			for i, k := range keys {
				values := []string{"u", "u", "u", "u"}
				values[i] = "full"
				solo := make([]string, i+1)
				for j := range solo {
					solo[j] = "unused-" + k
				}
				solo[i] = "full"
				for range 3 {
					if resp := ask(solo...); resp.OverallCode != rlsv3.RateLimitResponse_OK {
						t.Fatalf("using up %s: %v", k, resp)
					}
				}
				for range 2 {
					resp := ask(values...)
					if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[i].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
						t.Fatalf("%s used up: %v", k, resp)
					}
					for j, s := range resp.Statuses {
						if j != i && (s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != 3) {
							t.Fatalf("%s used up: %s reports %v, want OK with 3 remaining (nothing charged)", k, keys[j], s)
						}
					}
				}
			}
			for n := uint32(2); ; n-- {
				resp := ask("u", "u", "u", "u")
				if resp.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("with %d remaining everywhere: %v", n+1, resp)
				}
				for j, s := range resp.Statuses {
					if s.LimitRemaining != n {
						t.Fatalf("%s: remaining %d, want %d", keys[j], s.LimitRemaining, n)
					}
				}
				if n == 0 {
					break
				}
			}
			if resp := ask("u", "u", "u", "u"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("fourth request: %v", resp)
			}
		})
	}
}

// TestValidateAlgorithms: rls validate loads the mixed file and rejects, with file:line, the
// combinations that cannot work.
func TestValidateAlgorithms(t *testing.T) {
	bin := rlsBinary(t)
	dir := writeRules(t, map[string]string{"algo.yaml": algorithmRules})
	if out, err := exec.Command(bin, "validate", "--config", dir).CombinedOutput(); err != nil {
		t.Fatalf("rls validate of the mixed file: %v\n%s", err, out)
	}
	bad := writeRules(t, map[string]string{"bad.yaml": `domain: bad
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log, overdraft: true}
  - key: j
    rate_limit: {unit: month, requests_per_unit: 10, algorithm: fixed_window, timezone: Mars/Olympus}
`})
	out, err := exec.Command(bin, "validate", "--config", bad).CombinedOutput()
	path := filepath.Join(bad, "bad.yaml")
	for _, want := range []string{path + ":4: domain \"bad\": descriptor k: overdraft applies to algorithms gcra and fixed_window, not sliding_log",
		path + ":6: domain \"bad\": descriptor j: timezone \"Mars/Olympus\": not a known IANA time zone name"} {
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("rls validate: %v\n%s\nwant %q", err, out, want)
		}
	}
}
