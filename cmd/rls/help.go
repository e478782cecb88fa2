package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/rls-project/rls/internal/server"
)

// errHelp is returned once the help asked for (-h, --help, rls help) has been printed: the
// program then exits 0.
var errHelp = errors.New("help shown")

// command is one of rls's commands as its help presents it. flags registers the command's flags
// on a flag set, the same function the command parses its arguments with, so the help, the
// flag reference (docs/flags.md) and the command cannot disagree.
type command struct {
	name     string
	synopsis string // how it is called
	summary  string // one line, for the list of commands
	about    string // what it does, printed before its flags
	env      bool   // its flags can be set by RLS_* variables
	flags    func(fs *flag.FlagSet)
}

// commands lists rls's commands in the order the help shows them.
var commands = []command{
	{
		name:     "serve",
		synopsis: "rls [serve] [flags]",
		summary:  "serve ShouldRateLimit over gRPC and HTTP (the default command)",
		about: `Serves envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on --grpc-addr (:8081), and
health, readiness, metrics and POST /json on --http-addr (:8080). Rules come from --config (a
file or a directory, reloaded when it changes), from an xDS server (--xds-server), or, with
neither, from the embedded example rules. State is kept in this process (--backend memory) or in
Redis (--backend redis). A flag on the command line wins over its RLS_* variable, which wins over
envoyproxy/ratelimit's environment variables. Exit status: 0 after a drain on SIGTERM or SIGINT,
64 for a usage error (a bad flag, value or combination, found before anything is loaded), 1 when
what the flags name cannot be used (rules, certificates, a port taken).`,
		env:   true,
		flags: func(fs *flag.FlagSet) { c, b := server.DefaultConfig(), true; serveFlags(fs, &c, &b) },
	},
	{
		name:     "validate",
		synopsis: "rls validate [flags] PATH | rls validate --caller-policy FILE",
		summary:  "check rule files, or a caller policy, and report every error",
		about: `Loads the rule files at PATH (a file, or a directory of *.yaml/*.yml files; or give it as
--config) as serve would, and reports every error at once, each with its file and line. With
--caller-policy it checks that caller policy too, or alone without PATH. Exit status: 0 with a
summary of the domains loaded, 1 with the errors, 64 for a usage error.`,
		flags: func(fs *flag.FlagSet) { validateFlags(fs) },
	},
	{
		name:     "check",
		synopsis: "rls check [flags] key=value[,key=value...] ... [flags]",
		summary:  "ask a running server once and print its answer as JSON",
		about: `Sends one ShouldRateLimit request to a running rls's gRPC listener (--addr) and prints the
response as JSON (snake_case, durations in seconds: docs/commands.md). Each argument (or
--descriptor) is one descriptor: pairs split at ',', each at its first '=', keys and values
percent-decoded (%2C is ',', %3D '=', %25 '%'). Flags may come before or after the descriptors;
after "--" every argument is a descriptor. --tls, or any --tls-* flag, connects over TLS, with a
client certificate for mutual TLS. A domain the server's rules do not define is said on stderr;
the answer and exit status stay as Envoy would see them. Exit status: 0 for OK, 2 for
OVER_LIMIT, 1 on error (PERMISSION_DENIED from a caller policy among them), 64 for a usage error.`,
		env:   true,
		flags: func(fs *flag.FlagSet) { checkFlags(fs) },
	},
	{
		name:     "inspect",
		synopsis: "rls inspect [flags] key=value[,key=value...] ... [flags]",
		summary:  "read a descriptor's state from a running server, charging nothing",
		about: `Calls GET /v1/keys on a running rls's HTTP listener (--http-url) and prints, for every limit
the descriptor matches, what remains, when it resets and any debt, as JSON in check's style. It
charges nothing. Descriptors and flags are read as rls check reads them. An https:// URL (or a
bare host:port with a --tls flag) connects over TLS. Exit status: 0, 1 on error, 64 for a usage
error.`,
		env:   true,
		flags: func(fs *flag.FlagSet) { keysFlags(fs, false) },
	},
	{
		name:     "reset",
		synopsis: "rls reset --admin-token-file FILE [flags] key=value[,key=value...] ... [flags]",
		summary:  "give a descriptor's budget back (needs the admin token)",
		about: `Calls POST /v1/keys on a running rls's HTTP listener (--http-url) with the admin token of
--admin-token-file: the keys of every limit the descriptor matches get their whole budget back,
and their state after is printed as inspect prints it. The server must run with
--admin-token-file (else 404). Descriptors, flags and TLS are as for rls inspect. Exit status:
0, 1 on error, 64 for a usage error.`,
		env:   true,
		flags: func(fs *flag.FlagSet) { keysFlags(fs, true) },
	},
	{
		name:     "replay",
		synopsis: "rls replay --config RULES [--input FILE] [--compare OTHER_RULES] [--format table|csv|html]",
		summary:  "decide recorded requests offline against rules, and report what they would do",
		about: `Reads recorded requests (rls's decision log, JSON Lines of /json bodies with a "time", or an
Envoy JSON access log through --mapping) and decides each at its recorded time against the rules
of --config, as fast as it can, with the decision functions the service runs: no clock, no sleep,
no server. Prints per rule the requests, the would-be denials and the keys most denied, as a
table, CSV or one self-contained HTML page with charts over time. --compare decides every
request under a second rule set too and shows what it changes. A line that cannot be replayed is
named with its line number; --on-error says whether to stop or go on. Exit status: 0, 1 on error,
64 for a usage error.`,
		flags: func(fs *flag.FlagSet) { replayFlags(fs) },
	},
	{
		name:     "top",
		synopsis: "rls top [flags]",
		summary:  "show the keys most denied or most hit, live, like top",
		about: `Reads /debug/top from a running rls's debug listener (--debug-url: rls serve's --debug-addr)
every --interval and shows it on a cleared screen until interrupted: per rule, its hits and
denials over the last minute (or --window 10m) and its top keys, each as the descriptor
rls inspect takes, with its hits, denials, the error bound of both, and what its last
decision left of its limit. --once prints one screen and exits. The server keeps these counts
unless --top-keys 0. Exit status: 0 when interrupted, 1 on error (with --once), 64 for a
usage error.`,
		env:   true,
		flags: func(fs *flag.FlagSet) { topCmdFlags(fs) },
	},
	{
		name:     "version",
		synopsis: "rls version | rls --version",
		summary:  "print which rls this is: version, commit, Go release",
		about: `Prints rls's version, the commit it was built from when Go recorded one, and the Go release
that built it, e.g. "rls v1.2.3 (commit 0123456789ab, go1.26.8)". A build from a work tree
without a version says "(devel)". The same is in the start line and the rls_build_info metric.`,
	},
	{
		name:     "help",
		synopsis: "rls help [COMMAND]",
		summary:  "list the commands and serve's flags, or say what one command does",
		about:    `Without a command, lists the commands and serve's flags; with one, says what it does and lists its flags.`,
	},
}

// lookupCommand returns the command called name.
func lookupCommand(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// commandFlags returns a command's flag set as the help shows it, with its defaults.
func commandFlags(c command) *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	if c.flags != nil {
		c.flags(fs)
	}
	return fs
}

// runHelp is `rls help [COMMAND]` and `rls -h`: the help asked for, on stdout.
func runHelp(args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) == 0, len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		printOverview(stdout)
		return errHelp
	case len(args) == 1:
		c, ok := lookupCommand(args[0])
		if !ok {
			fmt.Fprintf(stderr, "rls help: unknown command %q: want %s\n", args[0], commandNames())
			return errUsage
		}
		printCommandHelp(stdout, c)
		return errHelp
	default:
		fmt.Fprintln(stderr, "usage: rls help [COMMAND]")
		return errUsage
	}
}

// commandNames is the list of commands for an error message: "serve, validate, ... or help".
func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// printOverview writes what rls is, its commands one line each, then serve's flags.
func printOverview(w io.Writer) {
	fmt.Fprint(w, `rls is a rate-limit decision service for Envoy: it answers ShouldRateLimit (and, with --rlqs,
the Rate Limit Quota Service) from rule files in envoyproxy/ratelimit's format.

Usage:
  rls [serve] [flags]
  rls COMMAND [flags] [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\n\"rls help COMMAND\" or \"rls COMMAND --help\" says what a command does and lists its flags.\n\n")
	serve, _ := lookupCommand("serve")
	fmt.Fprintln(w, "Flags of serve, by concern, each also set by the RLS_* variable shown:")
	fs := commandFlags(serve)
	for _, g := range serveGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		printFlagsIf(w, fs, true, func(f *flag.Flag) bool { return serveGroup(f.Name) == g.name })
	}
}

// printCommandHelp writes what one command does, then its flags.
func printCommandHelp(w io.Writer, c command) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.synopsis, c.about)
	fs := commandFlags(c)
	if shownFlags(fs) == 0 {
		return
	}
	if c.env {
		fmt.Fprintln(w, "\nFlags, each also set by the RLS_* variable shown:")
	} else {
		fmt.Fprintln(w, "\nFlags:")
	}
	printFlags(w, fs, c.env)
}

// shownFlags counts the flags of fs that help and the flag reference show.
func shownFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if !hidden(f) {
			n++
		}
	})
	return n
}

// testingOnly reports whether a flag exists for the tests alone; the help and the flag
// reference leave those out.
func testingOnly(f *flag.Flag) bool { return strings.HasPrefix(f.Usage, "testing only") }

// hidden reports whether the help and the flag reference leave a flag out: one for the tests
// alone, or one kept for a release under an old name (deprecated).
func hidden(f *flag.Flag) bool { return testingOnly(f) || deprecated(f) }

// printFlags writes fs's flags, sorted by name, each with its RLS_* variable when env is set,
// its type and its default.
func printFlags(w io.Writer, fs *flag.FlagSet, env bool) {
	printFlagsIf(w, fs, env, func(*flag.Flag) bool { return true })
}

// printFlagsIf is printFlags of the flags that keep reports true of.
func printFlagsIf(w io.Writer, fs *flag.FlagSet, env bool, keep func(*flag.Flag) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if hidden(f) || !keep(f) {
			return
		}
		fmt.Fprintf(w, "  --%s", f.Name)
		if env {
			fmt.Fprintf(w, " (%s)", envName(f.Name))
		}
		if t := flagType(f); t != "bool" {
			fmt.Fprintf(w, " %s", t)
		}
		fmt.Fprintf(w, "\n    \t%s", f.Usage)
		if !zeroDefault(f) {
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// flagType names the kind of value a flag takes, as the flag package's own help does (bool,
// string, duration, int, uint, float, or value for a flag of its own type).
func flagType(f *flag.Flag) string {
	if name, _ := flag.UnquoteUsage(f); name != "" {
		return name
	}
	return "bool"
}

// zeroDefault reports whether a flag's default is its type's zero value, which the help does not
// print: false, "" (none), 0.
func zeroDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "false":
		return true
	case "0", "0s":
		return flagType(f) != "string"
	}
	return false
}
