// Package backend decides rate limits (package limit says what one is): the Decision and State
// value types, GCRA and the window algorithms (fixed window on the clock or the calendar,
// sliding window, sliding log) as pure functions over integer time, and the stores that keep their state (memory, redis) behind one
// small interface. DecideBatch states the rules of a batch (all or nothing, repeated keys,
// shadow and quota requests) once; every store applies what it decides.
//
// Time is counted in integer microseconds and the theoretical arrival time (TAT) is kept as an
// exact rational (microseconds plus a remainder in units of 1/Rate µs), so a limit such as
// 7 per second has no rounding at all: GCRA here admits exactly what a token bucket with the same
// rate and capacity, computed in rational arithmetic, admits.
package backend
