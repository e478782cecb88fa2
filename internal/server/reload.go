package server

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/rls-project/rls/internal/reload"
	"github.com/rls-project/rls/internal/server/sighup"
)

// startReload reloads the rules at path by calling apply whenever they change on disk, and on
// SIGHUP, until ctx ends. apply loads and validates the whole set and swaps it in, or keeps the
// running rules and returns the errors. An empty path (the embedded rules) is never watched.
// The watches are in place when startReload returns; hup reloads as a SIGHUP does.
func startReload(ctx context.Context, rc ReloadConfig, path string, apply func() error, log *slog.Logger) (hup func(), err error) {
	// Buffered so a SIGHUP that arrives during a reload is not lost: it reloads again after.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGHUP)
	w, err := reload.New(reload.Options{Path: path, Debounce: rc.Debounce, Signals: sig, Apply: apply, Log: log})
	if err != nil {
		signal.Stop(sig)
		return nil, err
	}
	go func() {
		defer signal.Stop(sig)
		w.Run(ctx)
	}()
	return func() {
		select {
		case sig <- syscall.SIGHUP:
		default: // one is pending already
		}
	}, nil
}

// A SIGHUP before the watchers are ready is caught from the process's first instants by
// package sighup. One that arrived before the rules were first read asks for nothing: they are
// read now (earlySIGHUPBeforeLoad). One that arrived after, while the backend was connecting,
// may name an edit the first load did not see: the watchers reload once they are ready
// (earlySIGHUPAfterLoad).

func (s *Server) earlySIGHUPBeforeLoad() {
	if sighup.Take() {
		s.log.Info("SIGHUP before the rules were first loaded: nothing to reload, they are loaded now")
	}
}

func (s *Server) earlySIGHUPAfterLoad(reloads ...func()) {
	if !sighup.Take() {
		return
	}
	s.log.Info("SIGHUP while rls was starting: reloading now that the watchers are ready")
	for _, r := range reloads {
		if r != nil {
			r()
		}
	}
}
