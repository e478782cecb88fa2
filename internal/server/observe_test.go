package server

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/logthrottle"
)

func TestTracingErrorsThrottled(t *testing.T) {
	var buf bytes.Buffer
	warn := logthrottle.New(slog.New(slog.NewTextHandler(&syncWriter{w: &buf}, nil)), time.Hour)
	h := exportErrors(warn)
	for range 100 {
		h(errors.New("connection refused"))
	}
	if n := strings.Count(buf.String(), "tracing: export failed"); n != 1 {
		t.Fatalf("100 export errors logged %d times within the interval, want 1:\n%s", n, buf.String())
	}
	warn.Close()
	if !strings.Contains(buf.String(), "suppressed=99") {
		t.Fatalf("the interval's end does not count the 99 others:\n%s", buf.String())
	}
}

func TestTracingEnabled(t *testing.T) {
	tests := []struct {
		env  []string
		want bool
	}{
		{nil, false},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318"}, true},
		{[]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://collector:4318/v1/traces"}, true},
		{[]string{"OTEL_TRACES_EXPORTER=otlp"}, true},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "OTEL_TRACES_EXPORTER=none"}, false},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "OTEL_SDK_DISABLED=true"}, false},
	}
	for _, tc := range tests {
		if got := tracingEnabled(envMap(tc.env)); got != tc.want {
			t.Errorf("tracingEnabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}
