package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"

	"github.com/rls-project/rls/internal/backend"
)

// redisConfig holds the Redis backend's flags.
type redisConfig struct{}

// redisFlags registers the Redis backend's flags on fs.
func redisFlags(fs *flag.FlagSet) *redisConfig { return &redisConfig{} }

// newRedisBackend connects the Redis backend.
func newRedisBackend(ctx context.Context, rc *redisConfig, log *slog.Logger) (backend.Backend, error) {
	return nil, errors.New("--backend redis: not available in this build")
}
