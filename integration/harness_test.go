// Package integration runs the real rls binary over real gRPC and HTTP.
package integration

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rls-project/rls/internal/rlstest"
)

// repoRoot is the module root, one level above this package.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// rlsBinary builds cmd/rls once per test run, with the race detector when the tests run with
// it, and returns its path.
func rlsBinary(t testing.TB) string {
	t.Helper()
	return rlstest.BuildBinary(t, raceEnabled || os.Getenv("RLS_RACE_BIN") == "1")
}

// rlsProc is one running rls process.
type rlsProc struct{ *rlstest.Proc }

// startRLS starts the rls binary with args (plus --grpc-addr, --http-addr and --debug-addr on
// loopback port 0 unless args set them, the ports rls then reports having bound), waits until
// /readyz answers 200 and stops the process when the test ends. env is added to the process
// environment. Port 0 leaves the choice to the kernel at bind time: a port picked free
// beforehand may be taken by another test's server before rls binds it.
func startRLS(t testing.TB, env []string, args ...string) *rlsProc {
	t.Helper()
	p := launchRLS(t, env, args...)
	p.WaitReady(t)
	return p
}

// launchRLS is startRLS without waiting for readiness: it returns once rls serves.
func launchRLS(t testing.TB, env []string, args ...string) *rlsProc {
	t.Helper()
	joined := strings.Join(args, " ")
	for _, flag := range []string{"--grpc-addr", "--http-addr", "--debug-addr"} {
		if !strings.Contains(joined, flag) {
			args = append(args, flag, "127.0.0.1:0")
		}
	}
	return &rlsProc{rlstest.Launch(t, rlsBinary(t), env, args...)}
}

// client dials the process over gRPC.
func (p *rlsProc) client(t testing.TB) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// writeRules writes files (name → content) into a new directory and returns it.
func writeRules(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
