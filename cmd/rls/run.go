package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
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
	case "replay":
		err = runReplay(args, stdout, stderr)
	case "top":
		err = runTop(ctx, args, env, stdout, stderr)
	case "version":
		err = runVersion(args, stdout, stderr)
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
// else serve; --version (or -version) first is the version command.
func commandName(args []string) (name string, explicit bool) {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		return "version", true
	}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], true
	}
	return "serve", false
}

// runServe is `rls serve`: it parses and validates the configuration, then serves until ctx ends.
func runServe(ctx context.Context, args, env []string, stderr io.Writer) error {
	cfg, from, err := parseServe(args, env, stderr)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %s", errUsage, nameSources(err.Error(), from))
	}
	return server.Serve(ctx, cfg, stderr)
}

// nameSources rewrites the flags msg names that were not set on the command line into where
// their value came from, so that the message points at what to change: "--backend" set by
// RLS_BACKEND becomes "RLS_BACKEND"; set by envoyproxy/ratelimit's BACKEND_TYPE, "--backend
// (from BACKEND_TYPE)". from maps a flag's name to its source, as parseServe returns it.
func nameSources(msg string, from map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(msg); {
		j := strings.Index(msg[i:], "--")
		if j < 0 {
			b.WriteString(msg[i:])
			break
		}
		j += i
		b.WriteString(msg[i:j])
		k := j + 2
		for k < len(msg) && (msg[k] == '-' || msg[k] >= 'a' && msg[k] <= 'z' || msg[k] >= '0' && msg[k] <= '9') {
			k++
		}
		name := msg[j+2 : k]
		switch src, ok := from[name]; {
		case !ok:
			b.WriteString(msg[j:k])
		case src == envName(name):
			b.WriteString(src)
		default:
			b.WriteString(msg[j:k] + " (from " + src + ")")
		}
		i = k
	}
	return b.String()
}

// parseArgs parses args into fs and returns the arguments that are not flags: flags may come
// before, between or after them, and every argument after "--" is one. -h or --help returns
// errHelp; any other error errUsage, after a message naming the flag as it was typed and a
// pointer to the command's help.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.Usage = func() {}
	out := fs.Output()
	fs.SetOutput(io.Discard)
	defer fs.SetOutput(out)
	var rest []string
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			return nil, errHelp
		case err != nil:
			fmt.Fprintf(out, "%s\nRun \"rls help %s\" for its flags.\n", flagError(err, args), fs.Name())
			return nil, errUsage
		}
		left := fs.Args()
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), nil
		}
		if len(left) == 0 {
			return rest, nil
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// flagNamed finds the flag the flag package's errors name: "flag provided but not defined:
// -x", "invalid value ... for flag -x: ...", "flag needs an argument: -x".
var flagNamed = regexp.MustCompile(`(defined: |for flag |argument: )-([^\s:=]+)`)

// flagError is the flag package's error with the flag it names written as the user typed it
// (--nosuch stays --nosuch), or as --name when it cannot tell.
func flagError(err error, args []string) string {
	msg := err.Error()
	m := flagNamed.FindStringSubmatchIndex(msg)
	if m == nil {
		return msg
	}
	name := msg[m[4]:m[5]]
	typed := "--" + name
	for _, a := range args {
		if a == "--" {
			break
		}
		dashes := len(a) - len(strings.TrimLeft(a, "-"))
		if n, _, _ := strings.Cut(a[dashes:], "="); dashes > 0 && dashes <= 2 && n == name {
			typed = a[:dashes] + name
			break
		}
	}
	return msg[:m[4]-1] + typed + msg[m[5]:]
}

// envName is the environment variable that sets flag name: --grpc-addr is RLS_GRPC_ADDR.
func envName(name string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// deprecated reports whether a flag is kept for a release only: the help and the flag
// reference leave it out, and no RLS_* variable sets it.
func deprecated(f *flag.Flag) bool { return strings.HasPrefix(f.Usage, "deprecated") }

// parseFlags parses args into fs, as parseArgs, and returns the arguments that are not flags; a
// flag not given on the command line takes its RLS_* variable from env when set. -h or --help
// returns errHelp, for the caller to print the command's help; a flag the command does not have,
// or a value the flag does not take, from args or env, returns errUsage.
func parseFlags(fs *flag.FlagSet, args, env []string) ([]string, error) {
	rest, _, err := parseFlagsFrom(fs, args, env)
	return rest, err
}

// parseFlagsFrom is parseFlags, also returning the flags its RLS_* variables set, by name, with
// the variable.
func parseFlagsFrom(fs *flag.FlagSet, args, env []string) ([]string, map[string]string, error) {
	rest, err := parseArgs(fs, args)
	if err != nil {
		return nil, nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	from := map[string]string{}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || deprecated(f) {
			return
		}
		if v, ok := vars[envName(f.Name)]; ok {
			from[f.Name] = envName(f.Name)
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, err))
			}
		}
	})
	if len(errs) > 0 {
		return nil, nil, fmt.Errorf("%w: %w", errUsage, errors.Join(errs...))
	}
	return rest, from, nil
}
