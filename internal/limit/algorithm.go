package limit

import (
	"fmt"
	"time"
)

// Algorithm is how a limit counts requests.
type Algorithm uint8

const (
	// GCRA is the generic cell rate algorithm: Rate requests per Period, Burst at once (the
	// default).
	GCRA Algorithm = iota
	// FixedWindow counts the hits admitted in each window (see Window) and admits while the
	// count stays within Rate; the count starts again from 0 at each window's end.
	FixedWindow
	// SlidingWindow is the two-counter estimate: the hits of the current Period-long window
	// plus those of the previous one weighted by how much of it the last Period still covers
	// (in whole milliseconds), admitted while within Rate.
	SlidingWindow
	// SlidingLog keeps the instant of every admitted hit and admits while the hits of the last
	// Period stay within Rate: exact, at a cost in memory of 16 bytes per admitted request.
	SlidingLog
	// Concurrency is not a rate: at most Rate slots held at once, each named by its holder
	// (backend.Request.Slot) and freed by a release or, at the latest, Period after it was last
	// acquired (its lifetime). Burst equals Rate. A rule's concurrency field makes it, never
	// its algorithm field.
	Concurrency
)

var algorithmNames = [...]string{"gcra", "fixed_window", "sliding_window", "sliding_log", "concurrency"}

// Algorithms lists the rate algorithms' names, as the rule files spell them (Concurrency is
// not one: a rule asks for it with its concurrency field).
var Algorithms = algorithmNames[:Concurrency]

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// ParseAlgorithm parses an algorithm's name ("" is GCRA).
func ParseAlgorithm(s string) (Algorithm, bool) {
	if s == "" {
		return GCRA, true
	}
	for i, n := range Algorithms {
		if s == n {
			return Algorithm(i), true
		}
	}
	return GCRA, false
}

// MaxLogRate bounds a SlidingLog limit's Rate: its log holds at most Rate entries of 16 bytes,
// so a key takes at most 16 KB, which each decision on it reads and writes whole. Measured in
// Redis (BENCHMARKS.md): 80 µs of Redis time per decision on a log of 1,000 entries, 7 times
// GCRA's; 600 µs at 10,000, enough for one busy key to take most of a Redis. Rates above it
// are what sliding_window, fixed_window and GCRA are for.
const MaxLogRate = 1_000

// Overdraws reports whether a limit of algorithm a can hold an overdraft: GCRA and FixedWindow
// can, the sliding algorithms cannot repay a charge that went over.
func (a Algorithm) Overdraws() bool { return a == GCRA || a == FixedWindow }

// MaxInFlight bounds a Concurrency limit's Rate: a key holds at most that many slots, each its
// id (at most MaxValueBytes) and an expiry, in memory or in one Redis sorted set.
const MaxInFlight = 10_000

// MaxSlotLifetime bounds a Concurrency limit's Period, the lifetime of a slot never released.
const MaxSlotLifetime = 24 * time.Hour
