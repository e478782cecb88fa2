package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// reloadRules is generation g's rule set: both descriptors' limits are 1000+g, so a response
// names the generation that answered it, and a response whose two limits differ saw two sets.
// The burst is so large that nothing is denied. An invalid set (bad) has gen_b's unit wrong on
// line 6 and a limit for gen_a that must never be seen.
func reloadRules(g int, bad bool) string {
	unit := "second"
	if bad {
		unit = fmt.Sprintf("eon_%d", g)
	}
	return fmt.Sprintf(`domain: reload
descriptors:
  - key: gen_a
    rate_limit: {unit: second, requests_per_unit: %d, burst: 1000000}
  - key: gen_b
    rate_limit: {unit: %s, requests_per_unit: %d, burst: 1000000}
`, 1000+g, unit, 1000+g)
}

var reloadRequest = &rlsv3.RateLimitRequest{
	Domain: "reload", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("gen_a", "x"), d("gen_b", "x")},
}

// generation returns the generation that answered resp, or an error when resp is not a
// complete answer of one valid generation: 0 (the rules rls started with) or an odd step.
func generation(resp *rlsv3.RateLimitResponse) (int, error) {
	st := resp.GetStatuses()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(st) != 2 || st[0].GetCurrentLimit() == nil || st[1].GetCurrentLimit() == nil {
		return 0, fmt.Errorf("not two OK statuses with limits: %v", resp)
	}
	a, b := int(st[0].GetCurrentLimit().GetRequestsPerUnit())-1000, int(st[1].GetCurrentLimit().GetRequestsPerUnit())-1000
	switch {
	case a != b:
		return 0, fmt.Errorf("two rule sets in one answer: gen_a from generation %d, gen_b from %d", a, b)
	case a != 0 && a%2 == 0:
		return 0, fmt.Errorf("generation %d answered, from a set that is invalid", a)
	case a < 0 || a > reloadSteps:
		return 0, fmt.Errorf("generation %d answered, which was never written", a)
	}
	return a, nil
}

const reloadSteps = 100

// TestHotReloadUnderLoad makes 100 reloads, odd steps valid and even steps invalid, by three
// means in turn: a file renamed over edge.yaml (an editor's save), a ConfigMap update (a new
// timestamped directory, ..data swapped), and SIGHUP after a change the watcher cannot see (a
// file replaced inside ..data's target, a subdirectory). Meanwhile goroutines call
// ShouldRateLimit without pause; no call may fail, every answer must come from one valid set,
// and no goroutine may see a generation older than one it saw before.
func TestHotReloadUnderLoad(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "rules")
	edge := filepath.Join(dir, "edge.yaml")
	cur := "" // the directory ..data points to
	isLink := false
	mkdir := func(name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rename := func(from, to string) {
		t.Helper()
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	symlink := func(target, link string) {
		t.Helper()
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	// configMapSwap updates dir as the kubelet updates a ConfigMap volume, and makes edge.yaml
	// the kubelet's symlink again if a rename replaced it.
	configMapSwap := func(step int, content string) {
		t.Helper()
		stamp := fmt.Sprintf("..gen_%d", step)
		mkdir(stamp)
		writeFile(filepath.Join(dir, stamp, "edge.yaml"), content)
		symlink(stamp, filepath.Join(dir, "..data_tmp"))
		rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))
		if !isLink {
			symlink(filepath.Join("..data", "edge.yaml"), filepath.Join(dir, ".edge.yaml.link"))
			rename(filepath.Join(dir, ".edge.yaml.link"), edge)
			isLink = true
		}
		if cur != "" {
			if err := os.RemoveAll(filepath.Join(dir, cur)); err != nil {
				t.Fatal(err)
			}
		}
		cur = stamp
	}
	configMapSwap(0, reloadRules(0, false))

	p := startRLS(t, nil, "--config", dir, "--reload-debounce", "50ms", "--log-format", "json")
	client := p.client(t)

	// The load.
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	var (
		calls    atomic.Int64
		failures atomic.Int64
		mu       sync.Mutex
		problems []string
		seen     = map[int]bool{}
		wg       sync.WaitGroup
	)
	problem := func(format string, args ...any) {
		failures.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	const workers = 6
	for w := range workers {
		wg.Go(func() {
			last := 0
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := client.ShouldRateLimit(cctx, reloadRequest)
				cancel()
				if ctx.Err() != nil {
					return
				}
				calls.Add(1)
				if err != nil {
					problem("worker %d: call failed: %v", w, err)
					continue
				}
				g, err := generation(resp)
				if err != nil {
					problem("worker %d: %v", w, err)
					continue
				}
				if g < last {
					problem("worker %d: generation %d answered after generation %d", w, g, last)
				}
				last = g
				mu.Lock()
				seen[g] = true
				mu.Unlock()
			}
		})
	}

	current := func() int {
		t.Helper()
		resp, err := client.ShouldRateLimit(ctxT(t), reloadRequest)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		g, err := generation(resp)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	const wait = 10 * time.Second
	awaitGeneration := func(step int, how string) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			g := current()
			if g == step {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("step %d (%s): generation %d still in force after %v\n%s", step, how, g, wait, p.Output())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wantErr := func(step int) string {
		return fmt.Sprintf(`%s:6: domain "reload": descriptor gen_b: unit "eon_%d": want second, minute, hour, day, week, month or year`, edge, step)
	}
	awaitRejection := func(step int, how string) {
		t.Helper()
		want := wantErr(step)
		deadline := time.Now().Add(wait)
		for !slices.Contains(ruleErrors(p.Output(), edge), want) {
			if time.Now().After(deadline) {
				t.Fatalf("step %d (%s): rls did not log %q within %v\n%s", step, how, want, wait, p.Output())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if g := current(); g != step-1 {
			t.Fatalf("step %d (%s): generation %d in force after the invalid set, want %d", step, how, g, step-1)
		}
	}

	// Each way of changing the rules takes both kinds of set, since 5 is odd. A ConfigMap swap
	// follows a rename (and makes edge.yaml a symlink again) and a SIGHUP (when only ..data
	// changes); SIGHUP steps change the file edge.yaml resolves to, in a subdirectory, where the
	// watcher sees nothing.
	ways := []string{"rename", "configmap", "sighup", "configmap", "sighup"}
	count := map[string]int{}
	start := time.Now()
	for step := 1; step <= reloadSteps; step++ {
		how := ways[(step-1)%len(ways)]
		count[how]++
		content := reloadRules(step, step%2 == 0)
		switch how {
		case "rename":
			writeFile(filepath.Join(dir, ".edge.yaml.tmp"), content)
			rename(filepath.Join(dir, ".edge.yaml.tmp"), edge)
			isLink = false
		case "configmap":
			configMapSwap(step, content)
		case "sighup":
			if !isLink {
				t.Fatalf("step %d: SIGHUP step without the ConfigMap layout", step)
			}
			tmp := filepath.Join(dir, cur, ".edge.yaml.tmp")
			writeFile(tmp, content)
			rename(tmp, filepath.Join(dir, cur, "edge.yaml"))
			p.Signal(t, syscall.SIGHUP)
		}
		if step%2 == 1 {
			awaitGeneration(step, how)
		} else {
			awaitRejection(step, how)
		}
	}
	elapsed := time.Since(start)
	if g := current(); g != reloadSteps-1 {
		t.Errorf("generation %d in force at the end, want %d, the last valid set", g, reloadSteps-1)
	}
	stopLoad()
	wg.Wait()

	// Every rejection logged is one of the invalid sets: none came from a half-written state.
	var want []string
	for step := 2; step <= reloadSteps; step += 2 {
		want = append(want, wantErr(step))
	}
	for _, e := range ruleErrors(p.Output(), edge) {
		if !slices.Contains(want, e) {
			t.Errorf("unexpected rule error logged: %s", e)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if f := failures.Load(); f > 0 {
		t.Errorf("%d of %d calls under load failed or were inconsistent; first ones:\n%s", f, calls.Load(), strings.Join(problems, "\n"))
	}
	// Each generation was in force for at least two debounces; the load saw most of them.
	if len(seen) < (reloadSteps/2)/2 {
		t.Errorf("the load saw only %d of %d valid generations: it did not overlap the reloads", len(seen), reloadSteps/2+1)
	}
	t.Logf("%d reloads (%v) in %v; %d calls from %d goroutines, %d generations seen",
		reloadSteps, count, elapsed.Round(time.Millisecond), calls.Load(), workers, len(seen))
}

// ruleErrors returns the errors about file that rls logged (as JSON lines), one per line of an
// error, in order.
func ruleErrors(output, file string) []string {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(file) + `:\d+: .*$`)
	var errs []string
	for _, line := range strings.Split(output, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		for _, v := range rec {
			if s, ok := v.(string); ok {
				errs = append(errs, re.FindAllString(s, -1)...)
			}
		}
	}
	return errs
}
