package server

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/server/sighup"
)

type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// hangUp sends this process SIGHUP and waits until package sighup has it: the test binary
// imports it, so the signal does not end the test.
func hangUp(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !sighup.Pending() {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP not caught within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A SIGHUP that arrives before the rules are first read asks for nothing: New says so and
// reloads nothing. (One that arrives after, while the backend connects, reloads once the
// watchers are ready: TestSIGHUPWhileStarting, through the binary and a Redis that never
// answers.)
func TestSIGHUPBeforeFirstLoad(t *testing.T) {
	sighup.Take()
	hangUp(t)
	var logs lockedLog
	s, err := New(context.Background(), testConfig(), &logs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if out := logs.String(); !strings.Contains(out, "SIGHUP before the rules were first loaded") || strings.Contains(out, "SIGHUP while rls was starting") {
		t.Fatalf("log:\n%s", out)
	}
	if sighup.Pending() {
		t.Fatal("the SIGHUP is still pending after New")
	}
}
