package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// reloadFlags registers the rule reload flags on fs.
func reloadFlags(fs *flag.FlagSet, rc *server.ReloadConfig) {
	fs.DurationVar(&rc.Debounce, "reload-debounce", rc.Debounce,
		"reload the rules once their files have been unchanged this long, so an editor's save or a ConfigMap update is loaded once, whole (SIGHUP reloads at once)")
}
