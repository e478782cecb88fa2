package redis

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// This file is the wire format between Go and gcra.lua, in one place: the arguments of a call
// and the reply it gets. gcra.lua's header describes the same format from the script's side;
// TestWireFormat pins it.
//
// Numbers travel as little-endian doubles, packed into one string per batch (arguments) or per
// call (reply): the script unpacks and packs them in one call each, and Go decodes them without
// allocating per value. Every number is an integer below 2^53, so exact as a double.

// Script operations (ARGV[1]).
const (
	opDecide = "d"
	opMerged = "m"
	opUndo   = "u"
)

// Sizes, in doubles.
const (
	valuesPerKey  = 8 // rate, period, burst, cost, flags, and the window: offset or start, end, next end
	decisionWords = 4 // allowed, remaining, retry_us, reset_us
	multiWords    = 5 // check remaining, check reset_us, delta_us, delta_frac, m; then m entries
	undoPerKey    = 7 // rate, period, burst, delta_us, delta_frac, overdraft + 2×algorithm, m; then m entries
	entryWords    = 2 // a sliding_log entry given back by an undo: instant, hits
	stateBytes    = 32
)

// call is one decide call of the script: a batch, or the part of it on one Cluster slot.
type call struct {
	// Arguments.
	keys      []string // stored key names
	vals      []byte   // per key: valuesPerKey doubles
	threshold int64    // quota refusal threshold (see gcra.lua)
	multi     bool     // other calls hold part of the batch: also reply check and delta

	// Reply, filled by decodeDecide.
	charged bool
	dec     []backend.Decision // per key
	check   []int64            // multi: per key remaining, reset µs
	delta   []int64            // multi: per key µs, frac, m, then m sliding_log entries (instant, hits)
	deltaAt []int              // multi: where each key's delta starts in delta
	err     error              // the call failed: no reply

	// Cluster: the node the call went to, and whether it goes after ASKING (its slot is being
	// migrated to that node).
	node   *node
	asking bool
}

// reset empties c for reuse, keeping its buffers.
func (c *call) reset() {
	c.keys = c.keys[:0]
	c.vals = c.vals[:0]
	c.threshold = 0
	c.multi = false
	c.charged = false
	c.dec = c.dec[:0]
	c.check = c.check[:0]
	c.delta = c.delta[:0]
	c.deltaAt = c.deltaAt[:0]
	c.err = nil
	c.node = nil
	c.asking = false
}

// add appends a request's key and values to c. now (µs) is this process's instant, from which
// the calendar windows around Redis's are computed.
func (c *call) add(key string, r *backend.Request, now int64) {
	flags := int64(r.Mode) * 2
	if r.Refund {
		flags++
	}
	if r.Limit.Overdraft {
		flags += 8
	}
	flags += 16 * int64(r.Limit.Algorithm)
	// The window: Period-long windows from an offset the script computes itself; calendar
	// windows (lengths Lua cannot know: time zones, months) as the window holding this
	// process's now and the next one, from which the script takes the one holding Redis's.
	var wa, wb, wc int64
	if w := r.Limit.Window; w.Calendar != limit.NoCalendar {
		wa, wb = r.Limit.Bounds(now)
		_, wc = r.Limit.Bounds(wb)
	} else {
		wa = w.Offset
	}
	// Any cost beyond the burst is denied (or refunds the whole burst), any beyond MaxCharge
	// overdraws as much, and any below 0 charges nothing, so the clamp changes no result and
	// keeps the double exact.
	cost := r.Limit.ClampCost(r.Cost)
	c.keys = append(c.keys, key)
	c.vals = appendDoubles(c.vals, r.Limit.Rate, int64(r.Limit.Period/time.Microsecond), r.Limit.Burst, cost, flags, wa, wb, wc)
}

// replyBytes is the length of c's reply; of a multi call's, the least (one without entries).
func (c *call) replyBytes() int {
	n := 1 + decisionWords*len(c.keys)
	if c.multi {
		n += multiWords * len(c.keys)
	}
	return 8 * n
}

// decideArgs returns the EVALSHA arguments of c at the instant now (0: Redis TIME).
func decideArgs(sha string, now int64, c *call) []any {
	args := make([]any, 0, 3+len(c.keys)+5)
	args = append(args, "evalsha", sha, len(c.keys))
	for i := range c.keys {
		args = append(args, &c.keys[i])
	}
	multi := "0"
	if c.multi {
		multi = "1"
	}
	return append(args, opDecide, now, c.threshold, multi, (*packed)(&c.vals))
}

// Arguments go to go-redis by pointer (*string, *packed): a pointer in an interface costs no
// allocation, where a string or a slice would cost one each, per key. The call they point into
// outlives the round trip.

// packed is a call's packed values, written as one bulk string.
type packed []byte

// MarshalBinary implements encoding.BinaryMarshaler, which go-redis writes as a bulk string.
func (p *packed) MarshalBinary() ([]byte, error) { return *p, nil }

// String is what go-redis prints of the argument (in errors and logs).
func (p *packed) String() string { return fmt.Sprintf("%x", []byte(*p)) }

// mergedArgs returns the EVALSHA arguments of one script call that decides calls in order, as
// they would be one after another. None of them may be multi.
func mergedArgs(sha string, now int64, calls []*call) []any {
	n := 0
	for _, c := range calls {
		n += len(c.keys)
	}
	args := make([]any, 0, 5+n+2*len(calls))
	args = append(args, "evalsha", sha, n)
	for _, c := range calls {
		for i := range c.keys {
			args = append(args, &c.keys[i])
		}
	}
	args = append(args, opMerged, now)
	for _, c := range calls {
		args = append(args, c.threshold, (*packed)(&c.vals))
	}
	return args
}

// undoArgs returns the EVALSHA arguments that give back what a decide call wrote; vals holds
// per key undoPerKey doubles, then the m entries the last of them counts (see appendUndo).
func undoArgs(sha string, now int64, keys []string, vals []byte) []any {
	args := make([]any, 0, 6+len(keys))
	args = append(args, "evalsha", sha, len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	return append(args, opUndo, now, vals)
}

// appendUndo appends to vals the undo values of key n of the multi call c, whose request is r,
// and reports whether there is anything to undo.
func (c *call) appendUndo(vals []byte, n int, r *backend.Request) ([]byte, bool) {
	d := c.delta[c.deltaAt[n]:]
	m := d[2]
	if d[0] == 0 && d[1] == 0 && m == 0 {
		return vals, false
	}
	od := 2 * int64(r.Limit.Algorithm)
	if r.Limit.Overdraft {
		od++
	}
	vals = appendDoubles(vals, r.Limit.Rate, int64(r.Limit.Period/time.Microsecond), r.Limit.Burst, d[0], d[1], od, m)
	return appendDoubles(vals, d[3:3+entryWords*m]...), true
}

// decodeDecide reads a decide reply into c.
func decodeDecide(reply string, c *call) error {
	if len(reply) != c.replyBytes() && !(c.multi && len(reply) > c.replyBytes()) {
		return fmt.Errorf("script reply: %d bytes for %d keys, want %d", len(reply), len(c.keys), c.replyBytes())
	}
	r := doubles(reply)
	c.charged = r.next() == 1
	c.dec = c.dec[:0]
	for range c.keys {
		c.dec = append(c.dec, backend.Decision{
			Allowed:    r.next() == 1,
			Remaining:  r.next(),
			RetryAfter: time.Duration(r.next()) * time.Microsecond,
			ResetAfter: time.Duration(r.next()) * time.Microsecond,
		})
	}
	c.check, c.delta, c.deltaAt = c.check[:0], c.delta[:0], c.deltaAt[:0]
	if !c.multi {
		return nil
	}
	for n := range c.keys {
		// What is left holds this key's words and the other keys' at least.
		if r.left() < multiWords*(len(c.keys)-n) {
			return fmt.Errorf("script reply: %d bytes for %d keys end inside key %d's delta", len(reply), len(c.keys), n)
		}
		c.check = append(c.check, r.next(), r.next())
		c.deltaAt = append(c.deltaAt, len(c.delta))
		c.delta = append(c.delta, r.next(), r.next())
		m := r.next()
		if m < 0 || m > int64(r.left()-multiWords*(len(c.keys)-n-1))/entryWords {
			return fmt.Errorf("script reply: %d bytes for %d keys, key %d's delta says %d entries", len(reply), len(c.keys), n, m)
		}
		c.delta = append(c.delta, m)
		for range entryWords * m {
			c.delta = append(c.delta, r.next())
		}
	}
	if r.left() != 0 {
		return fmt.Errorf("script reply: %d bytes for %d keys, %d more than the deltas say", len(reply), len(c.keys), 8*r.left())
	}
	return nil
}

// decodeMerged reads the reply of mergedArgs(calls) into each call.
func decodeMerged(reply string, calls []*call) error {
	want := 0
	for _, c := range calls {
		want += c.replyBytes()
	}
	if len(reply) != want {
		return fmt.Errorf("script reply: %d bytes for %d merged calls, want %d", len(reply), len(calls), want)
	}
	for _, c := range calls {
		n := c.replyBytes()
		if err := decodeDecide(reply[:n], c); err != nil {
			return err
		}
		reply = reply[n:]
	}
	return nil
}

// encodeState is the stored form of s: GCRA's four doubles (tat, frac, rate, period); a
// window's six (algorithm, end, count, previous count, rate, period); a log's five (3, rate,
// period, entries, hits before the first entry) and its entries (instant, hits admitted up to
// it since the key's first: cumulative, so that the script finds the live entries by binary
// search). The algorithm first tells the forms apart: a GCRA TAT is never 1, 2 or 3.
func encodeState(s backend.State) string {
	switch s.Alg {
	case limit.FixedWindow, limit.SlidingWindow:
		return string(appendDoubles(nil, int64(s.Alg), s.TAT, s.Frac, s.Prev, s.Rate, s.Period))
	case limit.SlidingLog:
		b := appendDoubles(nil, 3, s.Rate, s.Period, int64(len(s.Log)/2), 0)
		cum := int64(0)
		for i := 0; i+1 < len(s.Log); i += 2 {
			cum += s.Log[i+1]
			b = appendDoubles(b, s.Log[i], cum)
		}
		return string(b)
	}
	return string(appendDoubles(make([]byte, 0, stateBytes), s.TAT, s.Frac, s.Rate, s.Period))
}

// decodeState reads a stored state; ok is false for a value the script would ignore.
func decodeState(v string) (s backend.State, ok bool) {
	if len(v) >= 32 && len(v)%8 == 0 {
		r := doubles(v)
		switch alg := r.next(); {
		case (alg == 1 || alg == 2) && len(v) == 48:
			return backend.State{Alg: limit.Algorithm(alg), TAT: r.next(), Frac: r.next(), Prev: r.next(), Rate: r.next(), Period: r.next()}, true
		case alg == 3 && len(v) >= 40:
			s = backend.State{Alg: limit.SlidingLog, Rate: r.next(), Period: r.next()}
			n, cum := r.next(), r.next()
			if n < 0 || int64(len(v)) != 40+16*n {
				return backend.State{}, false
			}
			s.Log = make([]int64, 2*n)
			for i := 0; i < len(s.Log); i += 2 {
				t, c := r.next(), r.next()
				s.Log[i], s.Log[i+1], cum = t, c-cum, c
			}
			return s, true
		}
	}
	if len(v) != stateBytes || v[stateBytes-1] <= '9' {
		return backend.State{}, false // not packed: the text form ends with a digit
	}
	r := doubles(v)
	return backend.State{TAT: r.next(), Frac: r.next(), Rate: r.next(), Period: r.next()}, true
}

// appendDoubles appends vals as little-endian doubles. Every value must be an integer below
// 2^53 in magnitude, so exact.
func appendDoubles(buf []byte, vals ...int64) []byte {
	for _, v := range vals {
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(float64(v)))
	}
	return buf
}

// doubleReader reads little-endian doubles as integers; the caller checks the length first.
type doubleReader struct{ s string }

func doubles(s string) *doubleReader { return &doubleReader{s} }

// left is the number of whole doubles left to read.
func (r *doubleReader) left() int { return len(r.s) / 8 }

func (r *doubleReader) next() int64 {
	var b [8]byte
	copy(b[:], r.s[:8])
	r.s = r.s[8:]
	return int64(math.Float64frombits(binary.LittleEndian.Uint64(b[:])))
}
