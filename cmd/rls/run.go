package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/rls-project/rls/internal/server"
)

var (
	errOverLimit = errors.New("over limit")
	errUsage     = errors.New("usage")
)

// run is the whole program: args without the program name, env as os.Environ returns it.
func run(ctx context.Context, args []string, env []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "validate":
			return runValidate(args[1:], stdout, stderr)
		case "check":
			return runCheck(ctx, args[1:], env, stdout, stderr)
		case "inspect", "reset":
			return runKeys(ctx, args[0], args[1:], env, stdout, stderr)
		case "serve":
			args = args[1:]
		case "help":
			args = []string{"-h"}
		default:
			if !strings.HasPrefix(args[0], "-") {
				fmt.Fprintf(stderr, "rls: unknown command %q: want serve, validate, check, inspect or reset\n", args[0])
				return errUsage
			}
		}
	}
	cfg, err := parseServeFlags(args, env, stderr)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return server.Serve(ctx, cfg, stderr)
}

// envName is the environment variable that sets flag name: --grpc-addr is RLS_GRPC_ADDR.
func envName(name string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseFlags parses args into fs; a flag not given on the command line takes its RLS_* variable
// from env when set. -h prints usage (without testing-only flags) and returns errUsage; so
// does a value the flag does not take, from args or env.
func parseFlags(fs *flag.FlagSet, args, env []string) error {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of rls %s:\n", fs.Name())
		fs.VisitAll(func(f *flag.Flag) {
			if strings.HasPrefix(f.Usage, "testing only") {
				return
			}
			fmt.Fprintf(fs.Output(), "  --%s (%s)\n    \t%s", f.Name, envName(f.Name), f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(fs.Output(), " (default %q)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
	}
	if err := fs.Parse(args); err != nil {
		// The flag package has printed the error (or the help) already.
		return errUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v, ok := vars[envName(f.Name)]; ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, err))
			}
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errUsage, errors.Join(errs...))
	}
	return nil
}
