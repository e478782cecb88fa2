package service

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestDebugDecisionLine: at debug level every decided request logs one line with its domain,
// descriptors, hits and codes; at info none.
func TestDebugDecisionLine(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var buf bytes.Buffer
		f := newFixture(t, Options{Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))})
		f.ask(t, desc("key", "k-debug"))
		line := buf.String()
		if level == slog.LevelInfo {
			if strings.Contains(line, "decision") {
				t.Errorf("at info: %q, want no per-request line", line)
			}
			continue
		}
		for _, want := range []string{"msg=decision", "domain=api", `descriptors="key=k-debug"`, "overall_code=OK", "codes=OK"} {
			if !strings.Contains(line, want) {
				t.Errorf("at debug: %q, want %q in it", line, want)
			}
		}
	}
}
