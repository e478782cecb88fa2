// Package sighup catches SIGHUP from the first instants of the process: Go's default for it ends
// the process (exit 129), and rls's file watchers, which reload on it, start only once the rules
// are loaded and the backend connected, a second or more with a slow Redis. Its init runs
// among the first of the program's (it imports nothing but the signal packages), milliseconds
// before main; from then on a SIGHUP is remembered here until Take, and never kills the process.
package sighup

import (
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

var (
	caught  = make(chan os.Signal, 1)
	pending atomic.Bool // a SIGHUP arrived and was not taken yet; more than one are one
)

func init() {
	signal.Notify(caught, syscall.SIGHUP)
	go func() {
		for range caught {
			pending.Store(true)
		}
	}()
}

// Take reports whether a SIGHUP arrived since the process started or since the last Take, and
// forgets it.
func Take() bool { return pending.Swap(false) }

// Pending reports whether a SIGHUP arrived that Take has not taken yet.
func Pending() bool { return pending.Load() }

// Release gives SIGHUP back its default action (ending the process) unless another part of the
// program asked for it: for the commands that serve nothing, a terminal's hangup ends them.
func Release() {
	signal.Stop(caught)
}
