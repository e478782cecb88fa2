package backend_test

import (
	"testing"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
)

func TestMemoryConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		m, err := backend.NewMemory(backend.MemoryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}
