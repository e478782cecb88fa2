package server

import (
	"reflect"
	"testing"
)

// TestRedactArgs: /debug/pprof/cmdline shows the arguments with --redis-url's password and
// --xds-header's values hidden, in every form the flag package takes.
func TestRedactArgs(t *testing.T) {
	got := redactArgs([]string{"rls", "--redis-url", "redis://u:pw1@h:6379", "-redis-url=rediss://:pw2@h:1",
		"--xds-header", "authorization=Bearer tok", "--xds-header=x=tok2", "--config", "/a:b@c", "--redis-url"})
	want := []string{"rls", "--redis-url", "redis://u:xxx@h:6379", "-redis-url=rediss://:xxx@h:1",
		"--xds-header", "authorization=xxx", "--xds-header=x=xxx", "--config", "/a:b@c", "--redis-url"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("redactArgs:\n got %q\nwant %q", got, want)
	}
}
