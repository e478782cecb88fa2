// Command rls is a gRPC rate-limit decision service for Envoy's ext rate-limit filters:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, decided with exact GCRA.
//
//	rls [flags]                 serve (see rls -h)
//	rls validate PATH           check rule files (or --config PATH); exit 1 with every error
//	rls check [flags] k=v,...   ask a running server once and print the answer
//	rls inspect [flags] k=v,... read a descriptor's state from a running server, charging nothing
//	rls reset [flags] k=v,...   give a descriptor's budget back (needs the admin token)
//	rls top [flags]             the keys most denied, live, from a running server's /debug/top
//	rls version, rls --version  say which rls this is
//	rls help [COMMAND]          list the commands and serve's flags, or say what one command does
//
// Flags may come before or after a command's arguments.
//
// docs/flags.md lists every flag; TestFlagsDoc keeps it equal to the flag definitions.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/server/sighup"
)

func main() {
	// SIGHUP is caught from the first instants (package sighup's init) so that one sent while rls
	// starts does not end it; the commands that serve nothing end on it, as a terminal's hangup
	// asks.
	if name, _ := commandName(os.Args[1:]); name != "serve" {
		sighup.Release()
	}
	goredis.SetLogger(quietRedisLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := exitCode(run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}

// exitCode is the exit status for run's error, which it prints to stderr unless it was printed
// already: 0 for none, 2 for OVER_LIMIT, 64 for a usage error, 1 for any other.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errOverLimit):
		return 2
	case errors.Is(err, errUsage):
		// A bare errUsage was explained where it arose; one wrapped with a reason is not yet.
		if err != errUsage {
			fmt.Fprintln(stderr, "rls:", err)
		}
		return 64
	default:
		fmt.Fprintln(stderr, "rls:", err)
		return 1
	}
}
