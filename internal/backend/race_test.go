//go:build race

package backend_test

// raceEnabled: under the race detector sync.Pool drops items at random, so pooled scratch
// allocates.
const raceEnabled = true
