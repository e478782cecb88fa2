package redis

import (
	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// The stored states (see contract.go) as the tests write and read them: the script alone writes
// and reads them in production.

// encodeState is the stored form of s.
func encodeState(s backend.State) string {
	switch s.Alg {
	case limit.FixedWindow, limit.SlidingWindow:
		var v [windowWords]int64
		v[windowAlg], v[windowEnd], v[windowCount], v[windowPrev], v[windowRate], v[windowPeriod] = int64(s.Alg), s.TAT, s.Frac, s.Prev, s.Rate, s.Period
		return string(appendDoubles(nil, v[:]...))
	case limit.SlidingLog:
		var v [logWords]int64
		v[logAlg], v[logRate], v[logPeriod], v[logEntries] = int64(limit.SlidingLog), s.Rate, s.Period, int64(len(s.Log)/2)
		b := appendDoubles(nil, v[:]...)
		cum := int64(0)
		for i := 0; i+1 < len(s.Log); i += 2 {
			cum += s.Log[i+1]
			var e [logEntryWords]int64
			e[logEntryInstant], e[logEntryTotal] = s.Log[i], cum
			b = appendDoubles(b, e[:]...)
		}
		return string(b)
	}
	var v [gcraWords]int64
	v[gcraTAT], v[gcraFrac], v[gcraRate], v[gcraPeriod] = s.TAT, s.Frac, s.Rate, s.Period
	return string(appendDoubles(nil, v[:]...))
}

// decodeState reads a stored state; ok is false for a value the script would ignore.
func decodeState(v string) (s backend.State, ok bool) {
	if len(v) >= 8*gcraWords && len(v)%8 == 0 {
		switch alg := doubles(v).next(); {
		case (alg == int64(limit.FixedWindow) || alg == int64(limit.SlidingWindow)) && len(v) == 8*windowWords:
			var w [windowWords]int64
			doubles(v).record(w[:])
			return backend.State{Alg: limit.Algorithm(alg), TAT: w[windowEnd], Frac: w[windowCount], Prev: w[windowPrev],
				Rate: w[windowRate], Period: w[windowPeriod]}, true
		case alg == int64(limit.SlidingLog) && len(v) >= 8*logWords:
			r := doubles(v)
			var h [logWords]int64
			r.record(h[:])
			s = backend.State{Alg: limit.SlidingLog, Rate: h[logRate], Period: h[logPeriod]}
			n, cum := h[logEntries], h[logBase]
			if n < 0 || int64(len(v)) != 8*logWords+8*logEntryWords*n {
				return backend.State{}, false
			}
			s.Log = make([]int64, 2*n)
			for i := 0; i < len(s.Log); i += 2 {
				var e [logEntryWords]int64
				r.record(e[:])
				s.Log[i], s.Log[i+1], cum = e[logEntryInstant], e[logEntryTotal]-cum, e[logEntryTotal]
			}
			return s, true
		}
	}
	if len(v) != 8*gcraWords || v[len(v)-1] <= '9' {
		return backend.State{}, false // not packed: the text form ends with a digit
	}
	var g [gcraWords]int64
	doubles(v).record(g[:])
	return backend.State{TAT: g[gcraTAT], Frac: g[gcraFrac], Rate: g[gcraRate], Period: g[gcraPeriod]}, true
}
