package client

import (
	"testing"

	"github.com/rls-project/rls/internal/service"
)

// TestBoundsMatchServer pins the bounds the client checks before a call to the ones rls
// enforces: the client keeps its own copies so as not to import the rule loader, and a copy that
// drifted would send requests rls refuses, or refuse ones rls accepts.
func TestBoundsMatchServer(t *testing.T) {
	tests := []struct {
		name           string
		client, server int
	}{
		{"descriptors", maxDescriptors, service.MaxDescriptors},
		{"entries", maxEntries, service.MaxEntries},
		{"key bytes", maxKeyBytes, service.MaxKeyBytes},
		{"value bytes", maxValueBytes, service.MaxValueBytes},
	}
	for _, tc := range tests {
		if tc.client != tc.server {
			t.Errorf("%s: client allows %d, rls %d", tc.name, tc.client, tc.server)
		}
	}
}
