package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
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

func TestCallerIdentities(t *testing.T) {
	u, _ := url.Parse("spiffe://td/ns/a/sa/b")
	leaf := &x509.Certificate{URIs: []*url.URL{u}, DNSNames: []string{"b.a.svc"}}
	verified := credentials.TLSInfo{State: tls.ConnectionState{
		PeerCertificates: []*x509.Certificate{leaf},
		VerifiedChains:   [][]*x509.Certificate{{leaf, {}}},
	}}
	unverified := credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}}
	tests := []struct {
		name string
		ctx  context.Context
		want []string
	}{
		{"verified certificate", peer.NewContext(context.Background(), &peer.Peer{AuthInfo: verified}), []string{"spiffe://td/ns/a/sa/b", "b.a.svc"}},
		{"certificate not verified", peer.NewContext(context.Background(), &peer.Peer{AuthInfo: unverified}), nil},
		{"plaintext", peer.NewContext(context.Background(), &peer.Peer{}), nil},
		{"no peer (POST /json)", context.Background(), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := callerIdentities(tc.ctx); !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
