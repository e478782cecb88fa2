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

// run is the whole program: args without the program name, env as os.Environ returns it. The
// help asked for (rls -h, rls help, rls CMD --help) is written to stdout and returns nil.
func run(ctx context.Context, args []string, env []string, stdout, stderr io.Writer) error {
	name, explicit := commandName(args)
	if explicit {
		args = args[1:]
	}
	var err error
	switch name {
	case "validate":
		err = runValidate(args, stdout, stderr)
	case "check":
		err = runCheck(ctx, args, env, stdout, stderr)
	case "inspect", "reset":
		err = runKeys(ctx, name, args, env, stdout, stderr)
	case "help":
		err = runHelp(args, stdout, stderr)
	case "serve":
		err = runServe(ctx, args, env, stderr)
	default:
		fmt.Fprintf(stderr, "rls: unknown command %q: want %s (rls help lists them)\n", name, commandNames())
		return errUsage
	}
	if !errors.Is(err, errHelp) {
		return err
	}
	if c, ok := lookupCommand(name); ok && explicit && name != "help" {
		printCommandHelp(stdout, c)
	} else if name == "serve" {
		printOverview(stdout)
	}
	return nil
}

// commandName is the command args ask for: their first argument unless it is a flag (explicit),
// else serve.
func commandName(args []string) (name string, explicit bool) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], true
	}
	return "serve", false
}

// runServe is `rls serve`: it parses and validates the configuration, then serves until ctx ends.
func runServe(ctx context.Context, args, env []string, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, env, stderr)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return server.Serve(ctx, cfg, stderr)
}

// parseArgs parses args into fs: errHelp for -h or --help, errUsage (after the flag package's
// message and a pointer to the help) for any other error.
func parseArgs(fs *flag.FlagSet, args []string) error {
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return errHelp
	default:
		// The flag package has printed the error.
		fmt.Fprintf(fs.Output(), "Run \"rls help %s\" for its flags.\n", fs.Name())
		return errUsage
	}
}

// envName is the environment variable that sets flag name: --grpc-addr is RLS_GRPC_ADDR.
func envName(name string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseFlags parses args into fs; a flag not given on the command line takes its RLS_* variable
// from env when set. -h or --help returns errHelp, for the caller to print the command's help; a
// flag the command does not have, or a value the flag does not take, from args or env, returns
// errUsage.
func parseFlags(fs *flag.FlagSet, args, env []string) error {
	if err := parseArgs(fs, args); err != nil {
		return err
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
