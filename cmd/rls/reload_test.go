package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestReloadFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		want    time.Duration
		wantErr string
	}{
		{"default", nil, nil, 200 * time.Millisecond, ""},
		{"flag", []string{"--reload-debounce", "2s"}, nil, 2 * time.Second, ""},
		{"env", nil, []string{"RLS_RELOAD_DEBOUNCE=750ms"}, 750 * time.Millisecond, ""},
		{"zero", []string{"--reload-debounce", "0s"}, nil, 0, "--reload-debounce 0s: must be > 0"},
		{"negative", nil, []string{"RLS_RELOAD_DEBOUNCE=-1s"}, 0, "--reload-debounce -1s: must be > 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseServeFlags(tc.args, tc.env, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.Reload.Debounce != tc.want {
				t.Fatalf("debounce %v, err %v; want %v", c.Reload.Debounce, err, tc.want)
			}
		})
	}
}
