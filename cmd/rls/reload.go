package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rls-project/rls/internal/reload"
)

// reloadConfig holds the rule reload flags.
type reloadConfig struct {
	debounce time.Duration
}

// reloadFlags registers the rule reload flags on fs.
func reloadFlags(fs *flag.FlagSet) *reloadConfig {
	rc := &reloadConfig{}
	fs.DurationVar(&rc.debounce, "reload-debounce", reload.DefaultDebounce,
		"reload the rules once their files have been unchanged this long, so an editor's save or a ConfigMap update is loaded once, whole (SIGHUP reloads at once)")
	return rc
}

// startReload reloads the rules at path by calling apply whenever they change on disk, and on
// SIGHUP, until ctx ends. apply loads and validates the whole set and swaps it in, or keeps the
// running rules and returns the errors. An empty path (the embedded rules) is never watched.
// The watches are in place when startReload returns; it fails only for bad flag values.
func startReload(ctx context.Context, rc *reloadConfig, path string, apply func() error, log *slog.Logger) error {
	if rc.debounce <= 0 {
		return fmt.Errorf("--reload-debounce %v: must be > 0", rc.debounce)
	}
	// Buffered so a SIGHUP that arrives during a reload is not lost: it reloads again after.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	w, err := reload.New(reload.Options{Path: path, Debounce: rc.debounce, Signals: hup, Apply: apply, Log: log})
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
