package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeysCommandErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("  abc \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"token file missing", []string{"--admin-token-file", filepath.Join(dir, "none")}, "--admin-token-file: open"},
		{"token too short", []string{"--admin-token-file", short}, "the token must be at least 16 bytes"},
		{"inspect without descriptor", []string{"inspect"}, "give at least one descriptor"},
		{"inspect with a bad descriptor", []string{"inspect", "novalue"}, "want key=value"},
		{"reset without token file", []string{"reset", "k=v"}, "give --admin-token-file"},
		{"inspect of nothing listening", []string{"inspect", "--http-url", "127.0.0.1:1", "k=v"}, "127.0.0.1:1"},
		{"reset's --tls-cert without --tls-key", []string{"reset", "--admin-token-file", short, "--tls-cert", short, "k=v"}, "--tls-cert and --tls-key go together"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(context.Background(), tc.args, nil, io.Discard, &stderr)
			if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
				t.Fatalf("got %v / %q, want %q", err, stderr.String(), tc.want)
			}
		})
	}
}
