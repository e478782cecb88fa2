package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rls-project/rls/internal/server"
	"github.com/rls-project/rls/internal/top"
)

// topFlags registers serve's flags of the top talkers on fs.
func topFlags(fs *flag.FlagSet, c *server.TopConfig) {
	fs.IntVar(&c.Keys, "top-keys", c.Keys,
		"top talkers (/debug/top on --debug-addr, rls top): counters kept per rule and slot of time; a key's counts are exact within the rule's hits over this many (0: off)")
	fs.Int64Var(&c.MaxBytes, "top-max-bytes", c.MaxBytes,
		"top talkers: memory every rule's counters may take together; rules seen once it is reserved are not counted until idle rules give theirs back")
}

// topOptions are rls top's flags.
type topOptions struct {
	url, domain, rule, sort, window *string
	keys                            *int
	interval, timeout               *time.Duration
	once                            *bool
}

// topCmdFlags registers rls top's flags on fs.
func topCmdFlags(fs *flag.FlagSet) *topOptions {
	return &topOptions{
		url:      fs.String("debug-url", "localhost:6070", "rls's debug listener (rls serve's --debug-addr) as a URL, or a bare host:port (http)"),
		domain:   fs.String("domain", "", "only this domain (default: every domain)"),
		rule:     fs.String("rule", "", "only this rule, by its path as /debug/rules names it, e.g. user or api_key/model"),
		sort:     fs.String("sort", "denials", "order keys by denials or hits"),
		window:   fs.String("window", "1m", "the last 1m or 10m"),
		keys:     fs.Int("keys", 10, "keys shown per rule"),
		interval: fs.Duration("interval", time.Second, "time between refreshes"),
		timeout:  fs.Duration("timeout", 5*time.Second, "deadline of each call"),
		once:     fs.Bool("once", false, "print the top talkers once, without clearing the screen, and exit"),
	}
}

// runTop is `rls top`: /debug/top, shown every --interval on a cleared screen until interrupted.
func runTop(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := topCmdFlags(fs)
	rest, err := parseFlags(fs, args, env)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, rest)
	}
	q := url.Values{"sort": {*o.sort}, "window": {*o.window}, "keys": {strconv.Itoa(*o.keys)}}
	if *o.domain != "" {
		q.Set("domain", *o.domain)
	}
	if *o.rule != "" {
		q.Set("rule", *o.rule)
	}
	if _, bad := top.ParseQuery(q.Get); bad != "" {
		return fmt.Errorf("%w: --%s", errUsage, bad)
	}
	if *o.interval <= 0 {
		return fmt.Errorf("%w: --interval %v: want a positive duration", errUsage, *o.interval)
	}
	base := *o.url
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	target := strings.TrimSuffix(base, "/") + "/debug/top?" + q.Encode()
	for {
		rep, err := fetchTop(ctx, target, *o.timeout)
		var screen bytes.Buffer
		if !*o.once {
			screen.WriteString("\x1b[H\x1b[2J") // home, clear
		}
		if ctx.Err() != nil {
			return nil // interrupted
		}
		if err != nil {
			if *o.once {
				return err
			}
			fmt.Fprintf(&screen, "rls top: %v (retrying every %v)\n", err, *o.interval)
		} else {
			renderTop(&screen, *o.url, rep)
		}
		if _, err := stdout.Write(screen.Bytes()); err != nil || *o.once {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*o.interval):
		}
	}
}

// fetchTop reads one report from /debug/top.
func fetchTop(ctx context.Context, target string, timeout time.Duration) (*top.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New("GET /debug/top: " + resp.Status + ": " + strings.TrimSpace(string(body)))
	}
	rep := &top.Report{}
	if err := json.Unmarshal(body, rep); err != nil {
		return nil, fmt.Errorf("GET /debug/top: %w", err)
	}
	return rep, nil
}

// descriptorWidth is the widest descriptor shown; longer ones are cut and end in "…".
const descriptorWidth = 48

// renderTop writes one screen of rls top.
func renderTop(w io.Writer, addr string, rep *top.Report) {
	fmt.Fprintf(w, "rls top  %s  window %s since %s  by %s  %s\n", addr, rep.Window,
		rep.From.Local().Format("15:04:05"), rep.Sort, rep.At.Local().Format("15:04:05"))
	if rep.Untracked > 0 {
		fmt.Fprintf(w, "%d hits of rules past --top-max-bytes not counted\n", rep.Untracked)
	}
	if len(rep.Rules) == 0 {
		fmt.Fprintln(w, "\nno decisions in this window")
	}
	for _, r := range rep.Rules {
		fmt.Fprintf(w, "\n%s · %s   %d hits  %d denied  error ≤ %d\n", r.Domain, r.Rule, r.Hits, r.Denials, r.MaxError)
		fmt.Fprintf(w, "  %-*s %10s %10s %8s %10s %8s\n", descriptorWidth, "DESCRIPTOR", "HITS", "DENIED", "±ERR", "REMAINING", "LIMIT")
		for _, k := range r.Keys {
			d := k.Descriptor
			if utf8.RuneCountInString(d) > descriptorWidth {
				d = string([]rune(d)[:descriptorWidth-1]) + "…"
			}
			pad := descriptorWidth - utf8.RuneCountInString(d)
			fmt.Fprintf(w, "  %s%s %10d %10d %8d %10d %8d\n", d, strings.Repeat(" ", pad), k.Hits, k.Denials, k.Error, k.Remaining, k.Limit)
		}
	}
	if rep.RulesOmitted > 0 {
		fmt.Fprintf(w, "\n%d more rules: narrow with --domain or --rule\n", rep.RulesOmitted)
	}
}
