package integration

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/top"
)

const topRules = `
domain: top
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 30}
`

// topStart starts rls with topRules and args.
func topStart(t *testing.T, args ...string) *rlsProc {
	t.Helper()
	return startRLS(t, nil, append([]string{"--config", writeRules(t, map[string]string{"top.yaml": topRules})}, args...)...)
}

// userRequest is one request of the users' descriptors.
func userRequest(users ...string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "top"}
	for _, u := range users {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}}})
	}
	return req
}

// getTop reads /debug/top with query, returning the report and the size of its body.
func getTop(t *testing.T, p *rlsProc, query string) (top.Report, int) {
	t.Helper()
	resp, err := http.Get("http://" + p.DebugAddr + "/debug/top?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/top?%s: %d %s %v", query, resp.StatusCode, body, err)
	}
	var rep top.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, len(body)
}

// TestTopTalkersZipf: under a Zipf workload over a million users, decided by the real binary on
// the memory backend and on Redis, /debug/top holds every one of the true top 10 users by denials and by hits, each
// count within the error it states, that error within the rule's hits over the counters, and
// the rule's totals exact; the answer stays small however many keys are asked for.
func TestTopTalkersZipf(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string {
			return []string{"--backend", "redis", "--redis-url", redistest.URL(t, redistest.SingleEnv),
				"--redis-key-prefix", "toptest" + strconv.FormatUint(rand.Uint64(), 36) + ":", "--redis-timeout", "10s"}
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			// 256 counters: the true top 10 have more than hits/256 each, which space-saving
			// always keeps.
			p := topStart(t, append(b.args(t), "--top-keys", "256")...)
			zipfAgainst(t, p)
		})
	}
}

func zipfAgainst(t *testing.T, p *rlsProc) {
	const requests, batch, workers, counters = 500, 8, 8, 256
	c := p.client(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	hits, denials := map[string]int64{}, map[string]int64{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			z := rand.NewZipf(rand.New(rand.NewPCG(uint64(w), 7)), 1.2, 1, 999_999)
			users := make([]string, batch)
			for range requests / workers {
				for i := range users {
					users[i] = "u" + strconv.FormatUint(z.Uint64(), 10)
				}
				resp, err := c.ShouldRateLimit(ctx, userRequest(users...))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, st := range resp.Statuses {
					hits[users[i]]++
					if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
						denials[users[i]]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var total, denied int64
	for u, h := range hits {
		total += h
		denied += denials[u]
	}
	for _, sort := range []string{"denials", "hits"} {
		rep, size := getTop(t, p, "sort="+sort+"&keys=100000")
		if len(rep.Rules) != 1 {
			t.Fatalf("by %s: rules %+v, want user alone", sort, rep.Rules)
		}
		r := rep.Rules[0]
		if r.Hits != total || r.Denials != denied {
			t.Errorf("by %s: the rule's totals %d hits, %d denied; %d and %d sent", sort, r.Hits, r.Denials, total, denied)
		}
		if r.MaxError > total/counters {
			t.Errorf("by %s: max error %d past hits/counters = %d", sort, r.MaxError, total/counters)
		}
		// Asked for every key: at most the counters', each with a text of at most 131 bytes.
		if bound := 2048 + counters*(200+top.MaxTextBytes+3); len(r.Keys) > counters || size > bound {
			t.Errorf("by %s: %d keys in %d bytes: past %d keys or %d bytes", sort, len(r.Keys), size, counters, bound)
		}
		got := map[string]top.KeyReport{}
		for _, k := range r.Keys {
			got[strings.TrimPrefix(k.Descriptor, "user=")] = k
		}
		exact := denials
		if sort == "hits" {
			exact = hits
		}
		for _, u := range topOf(exact, 10) {
			k, ok := got[u]
			if !ok {
				t.Errorf("by %s: %s (%d hits, %d denied) of the true top 10 not reported", sort, u, hits[u], denials[u])
				continue
			}
			if d := hits[u] - k.Hits; d > k.Error || -d > k.Error || k.Error > r.MaxError {
				t.Errorf("by %s: %s: %d hits reported ± %d (rule's bound %d), %d true", sort, u, k.Hits, k.Error, r.MaxError, hits[u])
			}
			if k.Denials > denials[u] || denials[u] > k.Denials+k.Error {
				t.Errorf("by %s: %s: %d denials reported + %d, %d true", sort, u, k.Denials, k.Error, denials[u])
			}
		}
		t.Logf("by %s: %d hits, %d denied, %d users; max error %d; answer %d bytes", sort, total, denied, len(hits), r.MaxError, size)
	}
}

// topOf returns the n users with the largest counts.
func topOf(counts map[string]int64, n int) []string {
	users := make([]string, 0, len(counts))
	for u := range counts {
		users = append(users, u)
	}
	slices.SortFunc(users, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b)) })
	return users[:min(n, len(users))]
}

// TestTopTalkersBoundedRSS: 64,000 distinct keys grow rls's resident memory by no more than
// the top talkers' cap, the memory backend's and a few MiB: the counters are reserved once,
// whatever the number of keys. The binary is built without the race detector, whose shadow
// memory would be measured too.
func TestTopTalkersBoundedRSS(t *testing.T) {
	t.Parallel()
	const keys, batch, workers = 64_000, 64, 4
	const memoryMax = 2 << 20
	topMax := top.RuleBytes(top.DefaultKeys)
	p := &rlsProc{rlstest.Launch(t, rlstest.BuildBinary(t, false), nil, "--config", writeRules(t, map[string]string{"top.yaml": topRules}),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0",
		"--top-max-bytes", strconv.FormatInt(topMax, 10), "--memory-max-bytes", strconv.Itoa(memoryMax))}
	p.WaitReady(t)
	c := p.client(t)
	ctx := ctxT(t)
	send := func(from, n int) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				users := make([]string, batch)
				for i := from + w*batch; i < from+n; i += workers * batch {
					for j := range users {
						users[j] = fmt.Sprintf("%030d", i+j) // distinct, with the texts of a real id
					}
					if _, err := c.ShouldRateLimit(ctx, userRequest(users...)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	send(0, 20*batch*workers) // connections, buffers and the memory backend's first keys
	before, _ := p.Memory(t)
	send(1<<30, keys)
	after, _ := p.Memory(t)
	grown := after - before
	t.Logf("%d distinct keys: RSS %d → %d (%+d bytes); caps: top talkers %d, memory backend %d", keys, before, after, grown, topMax, memoryMax)
	if bound := topMax + memoryMax + 6<<20; grown > bound {
		t.Errorf("RSS grew %d bytes, past %d (the caps and 6 MiB)", grown, bound)
	}
	rep, _ := getTop(t, p, "keys=3&sort=hits")
	if len(rep.Rules) != 1 || rep.Rules[0].Hits < keys {
		t.Errorf("rules %+v: want user with at least %d hits", rep.Rules, keys)
	}
}

// loadTop sends requests until the test ends: user "heavy" in each, past its limit, and one of
// five light users beside it.
func loadTop(t *testing.T, p *rlsProc) {
	c := p.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = c.ShouldRateLimit(ctx, userRequest("heavy", "light"+strconv.Itoa(i%5)))
			time.Sleep(2 * time.Millisecond)
		}
	}()
}

// TestTopCommandInTmux: rls top, run in a terminal (a detached tmux session) against a server
// under load, shows the rule and the user denied most first, and refreshes.
func TestTopCommandInTmux(t *testing.T) {
	t.Parallel()
	p := topStart(t)
	loadTop(t, p)
	socket := "rls-top-test-" + strconv.FormatUint(rand.Uint64(), 36)
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", append([]string{"-L", socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", "top", "-x", "150", "-y", "40",
		rlsBinary(t)+" top --debug-url "+p.DebugAddr+" --interval 300ms --keys 5")
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", socket, "kill-server").Run() })
	heavy := regexp.MustCompile(`(?m)^  user=heavy +(\d+) +(\d+) +\d+ +0 +30$`)
	var screen string
	var first int64
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		screen = tmux("capture-pane", "-p", "-t", "top")
		if m := heavy.FindStringSubmatch(screen); m != nil {
			hits, _ := strconv.ParseInt(m[1], 10, 64)
			denied, _ := strconv.ParseInt(m[2], 10, 64)
			switch {
			case denied == 0:
			case first == 0:
				first = hits
			case hits > first:
				// Refreshed, and the screen is as a person sees it: the header, the rule, the
				// heavy user first of the rule's keys, the light users after it.
				lines := strings.Split(screen, "\n")
				if !strings.HasPrefix(lines[0], "rls top  "+p.DebugAddr+"  window 1m") ||
					!regexp.MustCompile(`(?m)^top · user +\d+ hits +\d+ denied +error ≤ \d+$`).MatchString(screen) ||
					!regexp.MustCompile(`(?m)^  DESCRIPTOR +HITS +DENIED +±ERR +REMAINING +LIMIT$\n  user=heavy .*\n  user=light\d `).MatchString(screen) {
					t.Fatalf("screen:\n%s", screen)
				}
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("rls top did not show user=heavy denied and refreshed within 20 s; screen:\n%s", screen)
}

// TestTopPageInChromium: the top talkers' page, loaded in headless Chromium from a server under
// load, renders the rule's table with the heavy user first and its bar full, loads nothing from
// elsewhere and logs nothing to the console (no errors, no refused loads).
func TestTopPageInChromium(t *testing.T) {
	t.Parallel()
	p := topStart(t)
	loadTop(t, p)
	getTop(t, p, "") // the listener answers
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "chromium", "--headless", "--no-sandbox", "--disable-gpu",
		"--user-data-dir="+t.TempDir(), "--no-first-run", "--enable-logging=stderr", "--v=0",
		"--virtual-time-budget=3000", "--dump-dom", "http://"+p.DebugAddr+"/debug/top.html?keys=3")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := stdout.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`<h2>top · user <span class="muted">\d+ hits, [1-9]\d* denied, error ≤ \d+</span></h2>`),
		regexp.MustCompile(`<table class="keys"><thead><tr><th>descriptor</th><th>hits</th><th>denied</th>`),
		regexp.MustCompile(`<tbody><tr><td>user=heavy</td><td>\d+</td><td>[1-9]\d*</td><td>\d+</td><td>0</td><td>30</td><td class="bar"><div style="width: 100(\.0)?%;"></div></td></tr><tr><td>user=light\d</td>`),
		regexp.MustCompile(`<div id="status" class="">window 1m from `),
	} {
		if !want.MatchString(dom) {
			t.Errorf("the page's DOM lacks %s:\n%s", want, dom)
		}
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, ":CONSOLE") {
			t.Errorf("console: %s", line)
		}
	}
}
