package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/rls-project/rls/internal/service"
)

// adminTokenFlag registers the key endpoints' flag (/v1/keys on --http-addr) on fs.
func adminTokenFlag(fs *flag.FlagSet, file *string) {
	fs.StringVar(file, "admin-token-file", *file,
		"file holding the bearer token that may reset keys (POST/DELETE /v1/keys on --http-addr); empty: resetting is off (404)")
}

// keysOptions are the flags of rls inspect and rls reset.
type keysOptions struct {
	addr, domain, tokenFile *string
	timeout                 *time.Duration
	descs                   []string
}

// keysFlags registers the flags of rls inspect and rls reset on fs.
func keysFlags(fs *flag.FlagSet) *keysOptions {
	o := &keysOptions{}
	o.addr = fs.String("addr", "http://localhost:8080", "rls HTTP address (--http-addr)")
	o.domain = fs.String("domain", "example", "rate-limit domain")
	o.timeout = fs.Duration("timeout", 5*time.Second, "deadline for the call")
	o.tokenFile = fs.String("admin-token-file", "", "reset: file holding the admin token (as given to rls serve)")
	fs.Func("descriptor", descriptorUsage, func(s string) error { o.descs = append(o.descs, s); return nil })
	return o
}

// runKeys is `rls inspect` (reset false) and `rls reset`: it calls /v1/keys on a running rls
// and prints the answer.
func runKeys(ctx context.Context, name string, args, env []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := keysFlags(fs)
	addr, domain, timeout, tokenFile := o.addr, o.domain, o.timeout, o.tokenFile
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	descs := o.descs
	descs = append(descs, fs.Args()...)
	if len(descs) == 0 {
		fmt.Fprintf(stderr, "rls %s: give at least one descriptor, e.g. rls %s --domain ai api_key=k1,model=m\n", name, name)
		return errUsage
	}
	// Checked here with the parser the server reads them with (and rls check reads its own
	// with), then sent as written.
	for _, d := range descs {
		if _, err := service.ParseDescriptor(d); err != nil {
			fmt.Fprintf(stderr, "rls %s: %v\n", name, err)
			return errUsage
		}
	}
	base := *addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	q := url.Values{"domain": {*domain}, "descriptor": descs}
	method := http.MethodGet
	var token []byte
	if name == "reset" {
		method = http.MethodPost
		if *tokenFile == "" {
			fmt.Fprintln(stderr, "rls reset: give --admin-token-file")
			return errUsage
		}
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return err
		}
		token = bytes.TrimSpace(b)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, body, err := callKeys(ctx, method, strings.TrimSuffix(base, "/")+"/v1/keys?"+q.Encode(), token)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, *addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		if resp.StatusCode == http.StatusNotFound && name == "reset" {
			msg += " (is rls serving with --admin-token-file?)"
		}
		return errors.New(resp.Status + ": " + msg)
	}
	_, err = stdout.Write(body)
	return err
}

// callKeys sends one /v1/keys request, with token as the bearer token when not nil, and returns
// the answer and its body (at most 1 MiB read).
func callKeys(ctx context.Context, method, url string, token []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, nil, err
	}
	if token != nil {
		req.Header.Set("Authorization", "Bearer "+string(token))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp, body, err
}
