package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
)

// runArgs runs rls with args and returns its exit status, stdout and stderr.
func runArgs(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, nil, &stdout, &stderr)
	return exitCode(err, &stderr), stdout.String(), stderr.String()
}

// TestHelpOverview: rls -h, --help, -help and rls help list every command with its one line,
// then serve's flags with their RLS_* variables and defaults, on stdout, exit 0.
func TestHelpOverview(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}, {"help", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errOut := runArgs(args...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q; want 0 and nothing on stderr", code, errOut)
			}
			flags := strings.Index(out, "Flags of serve")
			if flags < 0 {
				t.Fatalf("no serve flags:\n%s", out)
			}
			for _, c := range commands {
				line := strings.Index(out, "  "+c.name+" ")
				if line < 0 || line > flags || !strings.Contains(out[line:flags], c.summary) {
					t.Errorf("command %s and its line %q not listed before the flags:\n%s", c.name, c.summary, out)
				}
			}
			for _, want := range []string{
				"--grpc-addr (RLS_GRPC_ADDR) string", `(default ":8081")`,
				"--debug-addr (RLS_DEBUG_ADDR)", `(default "127.0.0.1:6070")`,
				"--rlqs (RLS_RLQS)\n", "--redis-timeout (RLS_REDIS_TIMEOUT) duration",
			} {
				if !strings.Contains(out[flags:], want) {
					t.Errorf("serve's flags lack %q", want)
				}
			}
			if strings.Contains(out, "clock-offset") || strings.Contains(out, "testing only") {
				t.Errorf("a testing-only flag is shown:\n%s", out)
			}
		})
	}
}

// TestHelpCommand: rls help CMD, rls CMD --help and rls CMD -h say what the command does, then
// list every one of its flags, on stdout, exit 0.
func TestHelpCommand(t *testing.T) {
	for _, c := range commands {
		forms := [][]string{{"help", c.name}}
		if c.name != "help" {
			forms = append(forms, []string{c.name, "--help"}, []string{c.name, "-h"})
		}
		for _, args := range forms {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := runArgs(args...)
				if code != 0 || errOut != "" {
					t.Fatalf("exit %d, stderr %q; want 0 and nothing on stderr", code, errOut)
				}
				if !strings.HasPrefix(out, "Usage: "+c.synopsis+"\n\n"+c.about+"\n") {
					t.Errorf("does not open with the synopsis and what %s does:\n%s", c.name, out)
				}
				flagsAt := strings.Index(out, "\nFlags")
				commandFlags(c).VisitAll(func(f *flag.Flag) {
					at := strings.Index(out, "  --"+f.Name+" ")
					if at < 0 {
						at = strings.Index(out, "  --"+f.Name+"\n")
					}
					switch {
					case hidden(f):
						if at >= 0 {
							t.Errorf("testing-only or deprecated flag --%s shown", f.Name)
						}
					case at < 0 || flagsAt < 0 || at < flagsAt:
						t.Errorf("flag --%s not listed after what the command does:\n%s", f.Name, out)
					case c.env && !strings.Contains(out[at:], "("+envName(f.Name)+")"):
						t.Errorf("flag --%s without its variable %s", f.Name, envName(f.Name))
					}
				})
			})
		}
	}
}

// TestHelpErrors: help of an unknown command, and a flag a command does not have, are usage
// errors (exit 64) on stderr that point at the help.
func TestHelpErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help", "frobnicate"}, `rls help: unknown command "frobnicate": want serve, validate, check, inspect, reset, replay, top, version or help`},
		{[]string{"help", "check", "reset"}, "usage: rls help [COMMAND]"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--nope"}, "flag provided but not defined: --nope\nRun \"rls help serve\" for its flags."},
		{[]string{"-nope"}, "flag provided but not defined: -nope\n"},
		{[]string{"--nope=1"}, "flag provided but not defined: --nope\n"},
		{[]string{"check", "k=v", "--nope"}, "flag provided but not defined: --nope\nRun \"rls help check\" for its flags."},
		{[]string{"check", "--hits", "many", "k=v"}, `invalid value "many" for flag --hits: `},
		{[]string{"inspect", "--domain"}, "flag needs an argument: --domain\n"},
		{[]string{"inspect", "--admin-token-file", "f", "k=v"}, "flag provided but not defined: --admin-token-file\nRun \"rls help inspect\" for its flags."},
		{[]string{"version", "extra"}, "usage: rls version"},
		{[]string{"check", "--nope"}, "Run \"rls help check\" for its flags."},
		{[]string{"validate", "--nope"}, "Run \"rls help validate\" for its flags."},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := runArgs(tc.args...)
			if code != 64 || out != "" || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 64, nothing on stdout, %q on stderr", code, out, errOut, tc.want)
			}
		})
	}
}

// TestFlagTypes: the help names the kind of value of every flag type rls uses.
func TestFlagTypes(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Bool("b", false, "")
	fs.String("s", "", "")
	fs.Int("i", 0, "")
	fs.Int64("i64", 0, "")
	fs.Uint("u", 0, "")
	fs.Float64("f", 0, "")
	fs.Duration("d", 0, "")
	fs.Func("v", "", func(string) error { return nil })
	want := map[string]string{"b": "bool", "s": "string", "i": "int", "i64": "int", "u": "uint", "f": "float", "d": "duration", "v": "value"}
	fs.VisitAll(func(f *flag.Flag) {
		if got := flagType(f); got != want[f.Name] {
			t.Errorf("--%s: %s, want %s", f.Name, got, want[f.Name])
		}
	})
}
