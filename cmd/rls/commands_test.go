package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/rlstest"
)

// encodedRules match only the decoded values: a descriptor sent with its %XX left in it matches
// no rule and is answered OK without a limit.
const encodedRules = `
domain: enc
descriptors:
  - key: path
    value: "/api,v1"
    descriptors:
      - key: user
        value: "a=b"
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: share
    value: "50%"
    rate_limit: {unit: hour, requests_per_unit: 7}
`

// TestDescriptorArgumentsDecodedAlike: rls check and rls inspect read a descriptor argument
// with the same parser, against the real binary: a percent-encoded ',', '=' or '%' is the
// character in both; check charges the key inspect then reads; a malformed escape and an empty
// key are usage errors in both.
func TestDescriptorArgumentsDecodedAlike(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: encodedRules})
	command := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := run(ctx, args, nil, &stdout, &stderr)
		return stdout.String() + stderr.String(), err
	}
	for _, tc := range []struct {
		arg     string
		entries string // as inspect reports the server read them
		limit   int
	}{
		{"path=%2Fapi%2Cv1,user=a%3Db", `[{"key":"path","value":"/api,v1"},{"key":"user","value":"a=b"}]`, 5},
		{"share=50%25", `[{"key":"share","value":"50%"}]`, 7},
	} {
		for i := 1; i <= 2; i++ {
			out, err := command("check", "--addr", p.GRPCAddr, "--domain", "enc", tc.arg)
			if err != nil {
				t.Fatalf("check %s: %v\n%s", tc.arg, err, out)
			}
			var resp struct {
				Statuses []struct {
					CurrentLimit struct {
						RequestsPerUnit int `json:"requests_per_unit"`
					} `json:"current_limit"`
					LimitRemaining int `json:"limit_remaining"`
				}
			}
			if err := json.Unmarshal([]byte(out), &resp); err != nil {
				t.Fatalf("check %s: %v\n%s", tc.arg, err, out)
			}
			if len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit.RequestsPerUnit != tc.limit || resp.Statuses[0].LimitRemaining != tc.limit-i {
				t.Fatalf("check %s, call %d: want the rule of %d with %d left; got\n%s", tc.arg, i, tc.limit, tc.limit-i, out)
			}
			out, err = command("inspect", "--http-url", p.HTTPAddr, "--domain", "enc", tc.arg)
			if err != nil {
				t.Fatalf("inspect %s: %v\n%s", tc.arg, err, out)
			}
			var keys struct {
				Descriptors []struct {
					Entries json.RawMessage
					Limits  []struct{ Remaining int }
				}
			}
			if err := json.Unmarshal([]byte(out), &keys); err != nil {
				t.Fatalf("inspect %s: %v\n%s", tc.arg, err, out)
			}
			var entries bytes.Buffer
			if len(keys.Descriptors) == 1 {
				_ = json.Compact(&entries, keys.Descriptors[0].Entries)
			}
			if len(keys.Descriptors) != 1 || entries.String() != tc.entries ||
				len(keys.Descriptors[0].Limits) != 1 || keys.Descriptors[0].Limits[0].Remaining != tc.limit-i {
				t.Fatalf("inspect %s after %d checks: want entries %s with %d left; got\n%s", tc.arg, i, tc.entries, tc.limit-i, out)
			}
		}
	}
	for _, tc := range []struct{ arg, want string }{
		{"path=100%", `invalid URL escape "%"`},
		{"path=%zz", `invalid URL escape "%zz"`},
		{"=v", "want key=value"},
		{"path=/a,=v", "want key=value"},
		{"%2C=v,x", "want key=value"},
	} {
		for _, cmd := range []string{"check", "inspect"} {
			addr := []string{"--addr", p.GRPCAddr}
			if cmd == "inspect" {
				addr = []string{"--http-url", p.HTTPAddr}
			}
			out, err := command(append(append([]string{cmd}, addr...), "--domain", "enc", tc.arg)...)
			if !errors.Is(err, errUsage) || !strings.Contains(out, tc.want) {
				t.Errorf("%s %s: got %v\n%s\nwant a usage error saying %q", cmd, tc.arg, err, out, tc.want)
			}
		}
	}
}
