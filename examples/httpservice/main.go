// Command httpservice is a small HTTP service rate-limited by rls through client/httplimit. It
// uses the rules rls serves by default (go run ./cmd/rls): 60 requests a minute per API key
// with bursts of 10, 5 login attempts a minute per client IP, and 1000 requests a second over
// everything.
//
//	go run ./cmd/rls &
//	go run ./examples/httpservice &
//	for i in $(seq 12); do curl -si -H 'X-API-Key: k1' localhost:8090/hello | head -1; done
//	for i in $(seq 6); do curl -si -XPOST localhost:8090/login | grep -E 'HTTP|Retry-After'; done
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/httplimit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "httpservice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("httpservice", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "localhost:8090", "listen address")
	rls := fs.String("rls", "localhost:8081", "rls gRPC address")
	proxies := fs.String("trusted-proxies", "", "comma-separated addresses or CIDRs whose X-Forwarded-For is believed")
	failure := fs.String("on-failure", "allow", "when rls does not answer in time: allow, deny or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	policy, ok := map[string]client.FailurePolicy{"allow": client.FailAllow, "deny": client.FailDeny, "error": client.FailError}[*failure]
	if !ok {
		return fmt.Errorf("--on-failure %q: want allow, deny or error", *failure)
	}
	var trusted []string
	if *proxies != "" {
		trusted = strings.Split(*proxies, ",")
	}
	c, err := client.New(*rls, client.Options{Domain: "example", OnFailure: policy})
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := newHandler(c, trusted)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	slog.New(slog.NewTextHandler(stderr, nil)).Info("httpservice serving", "addr", *addr, "rls", *rls, "on_failure", policy)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newHandler is the service: each route with the descriptors of its limits.
func newHandler(c *client.Client, trustedProxies []string) (http.Handler, error) {
	proxies, err := httplimit.TrustProxies(trustedProxies...)
	if err != nil {
		return nil, err
	}
	lim := httplimit.New(c, httplimit.Options{Headers: client.HeadersDraft})
	mux := http.NewServeMux()
	// Per API key (requests without a key skip that limit), and the global cap.
	mux.Handle("GET /hello", lim.Handler(http.HandlerFunc(hello),
		httplimit.By(httplimit.Header("X-API-Key", "api_key")),
		httplimit.By(httplimit.Generic("global"))))
	// Per client IP and path: the rule matches remote_address, then path "/login*".
	mux.Handle("POST /login", lim.Handler(http.HandlerFunc(login),
		httplimit.By(httplimit.ClientIP(proxies), httplimit.Path()),
		httplimit.By(httplimit.Generic("global"))))
	return mux, nil
}

func hello(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") }

func login(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "welcome\n") }
