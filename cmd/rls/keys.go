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
	url, oldAddr, domain, tokenFile *string
	timeout                         *time.Duration
	descs                           []string
	tls                             *clientTLS
}

// keysFlags registers the flags of rls inspect, or with reset of rls reset, on fs.
func keysFlags(fs *flag.FlagSet, reset bool) *keysOptions {
	o := &keysOptions{tokenFile: new(string), oldAddr: new(string)}
	o.url = fs.String("http-url", "localhost:8080", "rls's HTTP listener (rls serve's --http-addr) as a URL, http:// or https://; a bare host:port is https with any --tls flag, else http")
	o.domain = fs.String("domain", "example", "rate-limit domain")
	o.timeout = fs.Duration("timeout", 5*time.Second, "deadline for the call")
	if reset {
		o.tokenFile = fs.String("admin-token-file", "", "file holding the admin token (as given to rls serve)")
	}
	fs.Func("descriptor", descriptorUsage, func(s string) error { o.descs = append(o.descs, s); return nil })
	fs.StringVar(o.oldAddr, "addr", "", "deprecated: the old name of --http-url, for this release only")
	o.tls = clientTLSFlags(fs, "connect with TLS when --http-url is a bare host:port, as any --tls-* flag does (an https:// URL always does); verified against the system's roots unless --tls-ca")
	return o
}

// runKeys is `rls inspect` (reset false) and `rls reset`: it calls /v1/keys on a running rls
// and prints the answer.
func runKeys(ctx context.Context, name string, args, env []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := keysFlags(fs, name == "reset")
	domain, timeout, tokenFile := o.domain, o.timeout, o.tokenFile
	rest, err := parseFlags(fs, args, env)
	if err != nil {
		return err
	}
	addr := *o.url
	if *o.oldAddr != "" {
		fmt.Fprintf(stderr, "rls %s: --addr is deprecated here and goes in the next release: write --http-url (--addr is the gRPC address, as rls check takes it)\n", name)
		addr = *o.oldAddr
	}
	descs := o.descs
	descs = append(descs, rest...)
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
	base := addr
	switch {
	case strings.Contains(base, "://"):
	case o.tls.wanted():
		base = "https://" + base
	default:
		base = "http://" + base
	}
	client := http.DefaultClient
	if strings.HasPrefix(base, "https://") {
		cfg, err := o.tls.config()
		if err != nil {
			return err
		}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}}
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
	resp, body, err := callKeys(ctx, client, method, strings.TrimSuffix(base, "/")+"/v1/keys?"+q.Encode(), token)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, addr, err)
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
func callKeys(ctx context.Context, client *http.Client, method, url string, token []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, nil, err
	}
	if token != nil {
		req.Header.Set("Authorization", "Bearer "+string(token))
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp, body, err
}
