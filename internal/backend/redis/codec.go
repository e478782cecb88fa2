package redis

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// This file is the codec of contract.go's records: a call of the script as Go builds it, its
// arguments packed, and its reply decoded into decisions, undo records and give-backs.

// call is one decide call of the script: a batch, or the part of it on one Cluster slot.
type call struct {
	// Arguments.
	keys      []string // stored key names
	vals      []byte   // per key: valuesPerKey doubles
	threshold int64    // when to refuse the batch for its quota requests (see job.plan)
	multi     bool     // other calls hold part of the batch: also reply check and delta

	// Reply, filled by decodeDecide.
	charged bool
	now     int64              // µs: the instant the script decided at
	dec     []backend.Decision // per key
	check   []int64            // multi: per key remaining, reset µs
	delta   []int64            // multi: per key µs, frac, rate, period, m, then m sliding_log entries (instant, hits)
	deltaAt []int              // multi: where each key's delta starts in delta
	err     error              // the call failed: no reply

	// The arguments of its script call (decideArgs, or mergedArgs when it is the first of a
	// merged call) and its command, kept for the next.
	args []any
	cmd  goredis.Cmd

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
	c.now = 0
	c.dec = c.dec[:0]
	c.check = c.check[:0]
	c.delta = c.delta[:0]
	c.deltaAt = c.deltaAt[:0]
	c.err = nil
	c.node = nil
	c.asking = false
}

// add appends a request's key and its key record to c. now (µs) is this process's instant,
// from which the calendar windows around Redis's are computed.
func (c *call) add(key string, r *backend.Request, now int64) {
	var v [keyWords]int64
	v[keyRate], v[keyPeriod], v[keyBurst] = r.Limit.Rate, int64(r.Limit.Period/time.Microsecond), r.Limit.Burst
	// Any cost beyond the burst is denied (or refunds the whole burst), any beyond MaxCharge
	// overdraws as much, and any below 0 charges nothing, so the clamp changes no result and
	// keeps the double exact.
	v[keyCost] = r.Limit.ClampCost(r.Cost)
	v[keyFlags] = requestFlags(r)
	// The window: Period-long windows from an offset the script computes itself; calendar
	// windows (lengths Lua cannot know: time zones, months) as the window holding this
	// process's now and the next one, from which the script takes the one holding Redis's.
	if w := r.Limit.Window; w.Calendar != limit.NoCalendar {
		v[keyWindowA], v[keyWindowB] = r.Limit.Bounds(now)
		_, v[keyWindowC] = r.Limit.Bounds(v[keyWindowB])
	} else {
		v[keyWindowA] = w.Offset
	}
	c.keys = append(c.keys, key)
	c.vals = appendDoubles(c.vals, v[:]...)
}

// replyBytes is the length of c's reply; of a multi call's, the least (one without entries).
func (c *call) replyBytes() int {
	n := chargedWords + decisionWords*len(c.keys) // the charged record, then the decisions
	if c.multi {
		n += multiWords * len(c.keys)
	}
	return 8 * n
}

// decideArgs returns the EVALSHA arguments of c at the instant now (0: Redis TIME), in c's
// own buffer: valid until c's next call.
func decideArgs(sha string, now int64, c *call) []any {
	args := append(c.args[:0], "evalsha", shaArg(sha), len(c.keys))
	for i := range c.keys {
		args = append(args, &c.keys[i])
	}
	var multi any = "0" // a constant boxed: no allocation
	if c.multi {
		multi = "1"
	}
	argv := [decideArgc]any{argOp - 1: opDecide, argNow - 1: now, argThreshold - 1: c.threshold, argMulti - 1: multi,
		argValues - 1: (*packed)(&c.vals)}
	c.args = append(args, argv[:]...)
	return c.args
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
// they would be one after another, in the first call's buffer: valid until its next call. None
// of them may be multi.
func mergedArgs(sha string, now int64, calls []*call) []any {
	n := 0
	for _, c := range calls {
		n += len(c.keys)
	}
	args := append(calls[0].args[:0], "evalsha", shaArg(sha), n)
	for _, c := range calls {
		for i := range c.keys {
			args = append(args, &c.keys[i])
		}
	}
	argv := [argMerged - 1]any{argOp - 1: opMerged, argNow - 1: now}
	args = append(args, argv[:]...)
	for _, c := range calls {
		args = append(args, c.threshold, (*packed)(&c.vals))
	}
	calls[0].args = args
	return args
}

// undoArgs returns the EVALSHA arguments that give back what a decide call wrote; vals holds
// per key an undo record, then the entry records it counts (see appendUndo).
func undoArgs(sha string, now int64, keys []string, vals []byte) []any {
	return recordArgs(sha, opUndo, now, keys, vals)
}

// giveBackArgs returns the EVALSHA arguments of a give-back call; vals holds per key a
// give-back record (see appendGiveBack).
func giveBackArgs(sha string, now int64, keys []string, vals []byte) []any {
	return recordArgs(sha, opGiveBack, now, keys, vals)
}

// recordArgs returns the EVALSHA arguments of an operation whose ARGV is its op, its instant
// and one string of records (argUndo, argGiveBack).
func recordArgs(sha, op string, now int64, keys []string, vals []byte) []any {
	args := make([]any, 0, 6+len(keys))
	args = append(args, "evalsha", sha, len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	argv := [3]any{argOp - 1: op, argNow - 1: now, 2: vals}
	return append(args, argv[:]...)
}

// appendGiveBack appends g's give-back record to vals.
func appendGiveBack(vals []byte, g *leftover) []byte {
	var v [giveBackWords]int64
	v[giveBackHits], v[giveBackHeldUntil], v[giveBackExpires] = g.hits, g.heldUntil, g.expires
	v[giveBackRate], v[giveBackPeriod] = g.lim.Rate, int64(g.lim.Period/time.Microsecond)
	v[giveBackFlags] = requestFlags(&backend.Request{Limit: g.lim})
	return appendDoubles(vals, v[:]...)
}

// decodeGiven reads a give-back reply of n keys: per key the hits given back and whether the
// give-back came late.
func decodeGiven(reply string, n int) (given []int64, late []bool, err error) {
	if len(reply) != 8*givenWords*n {
		return nil, nil, fmt.Errorf("script reply: %d bytes for %d given records", len(reply), n)
	}
	r := doubles(reply)
	given, late = make([]int64, n), make([]bool, n)
	for i := range n {
		var v [givenWords]int64
		r.record(v[:])
		given[i], late[i] = v[givenHits], v[givenLate] == 1
	}
	return given, late, nil
}

// appendUndo appends to vals the undo record of key n of the multi call c, whose request is r,
// and its entries, and reports whether there is anything to undo.
func (c *call) appendUndo(vals []byte, n int, r *backend.Request) ([]byte, bool) {
	d := c.delta[c.deltaAt[n]:] // delta_us, delta_frac, delta_rate, delta_period, entries, then the entry records
	m := d[4]
	if d[0] == 0 && d[1] == 0 && m == 0 {
		return vals, false
	}
	var v [undoWords]int64
	v[undoRate], v[undoPeriod], v[undoBurst] = r.Limit.Rate, int64(r.Limit.Period/time.Microsecond), r.Limit.Burst
	v[undoDeltaUS], v[undoDeltaFrac], v[undoFlags], v[undoEntries] = d[0], d[1], requestFlags(r), m
	if d[2] > 0 {
		// A change in the state's own terms: undone in them, as under an overdraft limit of
		// those terms with no burst to speak of (spanCap: more than any), so that nothing caps
		// the state but MaxTolerance.
		v[undoRate], v[undoPeriod], v[undoBurst] = d[2], d[3], spanCap
		v[undoFlags] = requestFlags(&backend.Request{Limit: limit.Limit{Overdraft: true, Algorithm: limit.GCRA}})
	}
	vals = appendDoubles(vals, v[:]...)
	return appendDoubles(vals, d[5:5+entryWords*m]...), true
}

// decodeDecide reads a decide reply into c.
func decodeDecide(reply string, c *call) error {
	if len(reply) != c.replyBytes() && !(c.multi && len(reply) > c.replyBytes()) {
		return fmt.Errorf("script reply: %d bytes for %d keys, want %d", len(reply), len(c.keys), c.replyBytes())
	}
	r := doubles(reply)
	var ch [chargedWords]int64
	r.record(ch[:])
	c.charged, c.now = ch[chargedCharged] == 1, ch[chargedNow]
	c.dec = c.dec[:0]
	for range c.keys {
		var v [decisionWords]int64
		r.record(v[:])
		c.dec = append(c.dec, backend.Decision{
			Allowed:    v[decAllowed] == 1,
			Remaining:  v[decRemaining],
			RetryAfter: time.Duration(v[decRetry]) * time.Microsecond,
			ResetAfter: time.Duration(v[decReset]) * time.Microsecond,
		})
	}
	c.check, c.delta, c.deltaAt = c.check[:0], c.delta[:0], c.deltaAt[:0]
	if !c.multi {
		return nil
	}
	for n := range c.keys {
		// What is left holds this key's multi record and the other keys' at least.
		if r.left() < multiWords*(len(c.keys)-n) {
			return fmt.Errorf("script reply: %d bytes for %d keys end inside key %d's delta", len(reply), len(c.keys), n)
		}
		var v [multiWords]int64
		r.record(v[:])
		c.check = append(c.check, v[multiCheckRemaining], v[multiCheckReset])
		c.deltaAt = append(c.deltaAt, len(c.delta))
		m := v[multiEntries]
		if m < 0 || m > int64(r.left()-multiWords*(len(c.keys)-n-1))/entryWords {
			return fmt.Errorf("script reply: %d bytes for %d keys, key %d's delta says %d entries", len(reply), len(c.keys), n, m)
		}
		c.delta = append(c.delta, v[multiDeltaUS], v[multiDeltaFrac], v[multiDeltaRate], v[multiDeltaPeriod], m)
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

// record reads len(v) doubles into v.
func (r *doubleReader) record(v []int64) {
	for i := range v {
		v[i] = r.next()
	}
}

func (r *doubleReader) next() int64 {
	var b [8]byte
	copy(b[:], r.s[:8])
	r.s = r.s[8:]
	return int64(math.Float64frombits(binary.LittleEndian.Uint64(b[:])))
}
