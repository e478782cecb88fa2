package server

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/rls-project/rls/internal/reload"
)

// startReload reloads the rules at path by calling apply whenever they change on disk, and on
// SIGHUP, until ctx ends. apply loads and validates the whole set and swaps it in, or keeps the
// running rules and returns the errors. An empty path (the embedded rules) is never watched.
// The watches are in place when startReload returns.
func startReload(ctx context.Context, rc ReloadConfig, path string, apply func() error, log *slog.Logger) error {
	// Buffered so a SIGHUP that arrives during a reload is not lost: it reloads again after.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	w, err := reload.New(reload.Options{Path: path, Debounce: rc.Debounce, Signals: hup, Apply: apply, Log: log})
	if err != nil {
		signal.Stop(hup)
		return err
	}
	go func() {
		defer signal.Stop(hup)
		w.Run(ctx)
	}()
	return nil
}
