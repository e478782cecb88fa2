package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCallerPolicyStartErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(bad, []byte("default:\n  domains: [a]\n  overrides: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"bad file", []string{"--caller-policy", bad}, nil, "--caller-policy: " + bad + ":3: unknown key overrides in default"},
		{"from the environment", nil, []string{"RLS_CALLER_POLICY=" + bad}, bad + ":3: unknown key overrides"},
		{"missing file", []string{"--caller-policy", filepath.Join(dir, "none.yaml")}, nil, "--caller-policy: open " + filepath.Join(dir, "none.yaml")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--debug-addr", ""}, tc.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := run(ctx, args, tc.env, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestValidateCallerPolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	rules := filepath.Join(dir, "rules.yaml")
	for path, src := range map[string]string{
		good:  "callers:\n  - identities: [a]\n    domains: ['*']\ndefault:\n  domains: [public]\n",
		bad:   "callers:\n  - identities: [a]\n",
		rules: "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	} {
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name       string
		args       []string
		out, err   string
		usageError bool
	}{
		{"policy alone", []string{"validate", "--caller-policy", good}, `ok: caller policy ` + good + `: 1 caller entries; default domains ["public"]`, "", false},
		{"policy and rules", []string{"validate", "--caller-policy", good, rules}, "ok: 1 domain(s) from 1 file(s)", "", false},
		{"bad policy", []string{"validate", "--caller-policy", bad}, "", "--caller-policy: " + bad + ":2: callers #1: domains is missing", false},
		{"bad policy with rules", []string{"validate", "--caller-policy", bad, rules}, "", bad + ":2:", false},
		{"nothing", []string{"validate"}, "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout strings.Builder
			err := run(context.Background(), tc.args, nil, &stdout, io.Discard)
			switch {
			case tc.usageError:
				if err != errUsage {
					t.Fatalf("err %v, want a usage error", err)
				}
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
			default:
				if err != nil || !strings.Contains(stdout.String(), tc.out) {
					t.Fatalf("err %v, out %q; want %q", err, stdout.String(), tc.out)
				}
			}
		})
	}
}
