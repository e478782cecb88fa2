package redis

import (
	"fmt"
	"strings"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// This file is the contract between Go and decide.lua, in one place: the operations, the
// positions of ARGV, the records of doubles a call carries and its reply returns, the states a
// key stores, and the bits of a request's flags. luaConstants renders the same table as the Lua
// constants the script begins with (see script.go), so the script reads every position, format
// and bit by the name it has here; TestContract fails when decide.lua reads a record in another
// order than this table names it, or writes a number this table names.
//
// Numbers travel as little-endian doubles, packed into one string per batch (arguments) or per
// call (reply): the script unpacks and packs them in one call each, and Go decodes them without
// allocating per value. Every number is an integer below 2^53, so exact as a double.

// Script operations (ARGV[argOp]).
const (
	// opDecide decides one batch, or a Cluster slot's part of it. Rate is > 0: rls decides rate
	// 0 itself. The reply is one string: a charged record, per key a decision record, and when
	// the call is multi, per key a multi record and its entry records.
	opDecide = "d"
	// opMerged decides several batches, each as by opDecide not multi, in order, as one call each
	// would; the reply is their replies, concatenated. This pays the fixed cost of a script call
	// (and TIME) once for many concurrent calls.
	opMerged = "m"
	// opUndo subtracts a change opDecide wrote (for a batch another slot refused), within [now,
	// now + burst], or under overdraft [now, now + MaxTolerance]. Under the window algorithms
	// the change is (hits, the end of their window) or, under sliding_log, (hits, their instant)
	// and the entries to give back. The reply is the empty string.
	opUndo = "u"
	// opGiveBack gives back what leases did not use: per key a give-back record, whose hits go
	// back only while the lease is valid (Redis's now before its expiry) and only as many as
	// are still ahead of now in the part of the key's state the lease charged (see
	// leases.giveBack). A GCRA state is given back in the terms it was written in, never
	// re-expressed under the lease's limit nor capped at its burst. The reply is per key a
	// given record.
	opGiveBack = "g"
)

// ARGV positions (1-based, as Lua numbers them). Every operation begins with argOp and argNow;
// KEYS are the stored keys, in the order of the records.
const (
	argOp  = 1 // the operation
	argNow = 2 // the instant, µs (0: Redis TIME)
	// decide
	// argThreshold says when to refuse the batch for its quota requests: k > 0 when k quota
	// requests of this call are denied, which are then every quota request of the batch not
	// already denied; 0 never; -1 refused already (see job.plan).
	argThreshold = 3
	argMulti     = 4 // "1" when other calls hold part of the batch (Cluster slots): reply multi records too
	argValues    = 5 // per key a key record
	decideArgc   = 5
	// merged: from argMerged on, per batch its threshold and then its key records, as decide's
	// argThreshold and argValues; KEYS are the batches' keys in order.
	argMerged = 3
	// undo: per key an undo record, each followed by its entries.
	argUndo = 3
	// give back: per key a give-back record.
	argGiveBack = 3
)

// Flags (keyFlags, undoFlags): one layout for every operation. Refund and mode matter to a
// decision only; an undo reads the overdraft and the algorithm of the same request's flags.
const (
	flagRefund    = 1                 // give the cost back
	flagMode      = 2                 // + mode × flagMode (backend.Mode: Enforce, Shadow, Quota)
	modeSpan      = 4                 // modes are below modeSpan
	flagOverdraft = 8                 // the limit's Overdraft
	flagAlg       = 16                // + algorithm × flagAlg (limit.Algorithm)
	algSpan       = 4                 // algorithms are below algSpan
	flagShared    = flagAlg * algSpan // the limit's Shared
)

// fastFlags are the flags of the common request, which the script decides on its fast path
// (see fast in decide.lua): an enforced GCRA charge, without overdraft.
var fastFlags = requestFlags(&backend.Request{Mode: backend.Enforce, Limit: limit.Limit{Algorithm: limit.GCRA}})

// spanCap is a number of emission intervals more than any burst or cost (both at most 2^32,
// limit.Validate): a span of more intervals than that (a debt) is not counted exactly.
const spanCap = 1 << 33

// requestFlags is r's flags.
func requestFlags(r *backend.Request) int64 {
	flags := int64(r.Mode) * flagMode
	if r.Refund {
		flags += flagRefund
	}
	if r.Limit.Overdraft {
		flags += flagOverdraft
	}
	if r.Limit.Shared {
		flags += flagShared
	}
	return flags + flagAlg*int64(r.Limit.Algorithm)
}

// The records: runs of doubles, each field named as the script names the variable it reads the
// field into (or packs it from).

// Key record: one request of a decide call.
const (
	keyRate   = iota // > 0: rls decides rate 0 itself
	keyPeriod        // µs
	keyBurst
	keyCost  // clamped: Limit.ClampCost
	keyFlags // see requestFlags
	// The window: offset, 0, 0 for Period-long windows; for calendar windows the start and end
	// of the window holding rls's instant and the end of the next one (the script decides in
	// the window before, that one or the next, whichever holds its now).
	keyWindowA
	keyWindowB
	keyWindowC
	keyWords
)

// Charged record: what a decide reply begins with, per batch: whether the batch's charges were
// written (1) or not (0), and the instant the script decided at (µs, Redis's TIME unless the
// call fixed it), from which a lease's give-back is dated.
const (
	chargedCharged = iota
	chargedNow
	chargedWords
)

// Decision record: the reply per key, after the charged record.
const (
	decAllowed = iota
	decRemaining
	decRetry // µs
	decReset // µs
	decisionWords
)

// Multi record: per key after every decision record of a multi call. The check is what the key
// reports once the batch is undone; the delta the exact change written (zero but on a key's last
// occurrence), then as many entry records as it says.
const (
	multiCheckRemaining = iota
	multiCheckReset     // µs
	multiDeltaUS
	multiDeltaFrac // GCRA: in 1/rate µs; windows: the window's end, or sliding_log's instant
	// GCRA: the rate and period the delta is in, when the key's state is in terms of its own
	// (refunds under another limit: see backend.Refund); 0, 0 for the request's limit's.
	multiDeltaRate
	multiDeltaPeriod
	multiEntries
	multiWords
)

// Entry record: hits a sliding_log refund took from the entry at an instant, given back by undo.
const (
	entryInstant = iota
	entryHits
	entryWords
)

// Undo record: one key of an undo call, as a multi record of its decide call replied, then its
// entries.
const (
	undoRate = iota
	undoPeriod
	undoBurst
	undoDeltaUS
	undoDeltaFrac
	undoFlags // see requestFlags
	undoEntries
	undoWords
)

// Give-back record: one key of a give-back call. Hits are what the lease did not use; heldUntil
// (µs, Redis time) is where the lease's charge ended: under GCRA the key's TAT right after it,
// under fixed_window its window's end; expires (µs, Redis time) is the instant from which the
// give-back is late and gives nothing. Rate, period and flags are the lease's limit's.
const (
	giveBackHits = iota
	giveBackHeldUntil
	giveBackExpires
	giveBackRate
	giveBackPeriod
	giveBackFlags
	giveBackWords
)

// Given record: the reply per key of a give-back call: the hits given back, and whether the
// give-back came late (1: after its expiry, nothing given).
const (
	givenHits = iota
	givenLate
	givenWords
)

// Stored states: GCRA's (a TAT of tat + frac/rate µs, written under rate and period), a fixed or
// sliding window's, and a sliding log's header and then its entries (instant, hits admitted up
// to it since the key's first: cumulative, so that the script finds the live entries by binary
// search). A window's and a log's first double is the algorithm, which tells the forms apart: a
// GCRA TAT is never 1, 2 or 3.
const (
	gcraTAT = iota
	gcraFrac
	gcraRate
	gcraPeriod
	gcraWords
)

const (
	windowAlg = iota
	windowEnd
	windowCount
	windowPrev
	windowRate
	windowPeriod
	windowWords
)

const (
	logAlg = iota
	logRate
	logPeriod
	logEntries
	logBase // hits before the first entry
	logWords
)

const (
	logEntryInstant = iota
	logEntryTotal
	logEntryWords
)

// record is one record of the contract: its Lua name (the script's constants <lua>_FMT,
// <lua>_WORDS, <lua>_BYTES) and its fields in order, as the script names them.
type record struct {
	lua    string
	fields []string
}

// The fields of each record, by the indices above.
var (
	keyFields      = [keyWords]string{keyRate: "rate", keyPeriod: "period", keyBurst: "burst", keyCost: "cost", keyFlags: "flags", keyWindowA: "wa", keyWindowB: "wb", keyWindowC: "wc"}
	decisionFields = [decisionWords]string{decAllowed: "allowed", decRemaining: "remaining", decRetry: "retry_us", decReset: "reset_us"}
	multiFields    = [multiWords]string{multiCheckRemaining: "check_remaining", multiCheckReset: "check_reset_us", multiDeltaUS: "delta_us", multiDeltaFrac: "delta_frac", multiDeltaRate: "delta_rate", multiDeltaPeriod: "delta_period", multiEntries: "entries"}
	entryFields    = [entryWords]string{entryInstant: "instant", entryHits: "hits"}
	chargedFields  = [chargedWords]string{chargedCharged: "charged", chargedNow: "now"}
	giveBackFields = [giveBackWords]string{giveBackHits: "hits", giveBackHeldUntil: "held_until", giveBackExpires: "expires", giveBackRate: "rate", giveBackPeriod: "period", giveBackFlags: "flags"}
	givenFields    = [givenWords]string{givenHits: "given", givenLate: "late"}
	undoFields     = [undoWords]string{undoRate: "rate", undoPeriod: "period", undoBurst: "burst", undoDeltaUS: "delta_us", undoDeltaFrac: "delta_frac", undoFlags: "flags", undoEntries: "entries"}
	gcraFields     = [gcraWords]string{gcraTAT: "tat", gcraFrac: "frac", gcraRate: "rate", gcraPeriod: "period"}
	windowFields   = [windowWords]string{windowAlg: "alg", windowEnd: "stop", windowCount: "count", windowPrev: "prev", windowRate: "rate", windowPeriod: "period"}
	logFields      = [logWords]string{logAlg: "alg", logRate: "rate", logPeriod: "period", logEntries: "entries", logBase: "base"}
	logEntryFields = [logEntryWords]string{logEntryInstant: "instant", logEntryTotal: "total"}
)

// records is every record of the contract.
var records = []record{
	{"KEY", keyFields[:]},
	{"CHARGED", chargedFields[:]},
	{"DECISION", decisionFields[:]},
	{"MULTI", multiFields[:]},
	{"ENTRY", entryFields[:]},
	{"UNDO", undoFields[:]},
	{"GIVEBACK", giveBackFields[:]},
	{"GIVEN", givenFields[:]},
	{"SINGLE", append(chargedFields[:], decisionFields[:]...)}, // a one-key batch's reply: CHARGED, then DECISION
	{"GCRA_STATE", gcraFields[:]},
	{"WINDOW_STATE", windowFields[:]},
	{"LOG_STATE", logFields[:]},
	{"LOG_ENTRY", logEntryFields[:]},
}

// luaConstants renders the contract as the Lua constants decide.lua reads: the script as sent
// is this block and then decide.lua, one fixed text per build.
func luaConstants() string {
	var b strings.Builder
	b.WriteString("-- The contract with Go, rendered from contract.go (luaConstants): edit it there.\n")
	num := func(name string, v int64) { fmt.Fprintf(&b, "local %s = %d\n", name, v) }
	str := func(name, v string) { fmt.Fprintf(&b, "local %s = %q\n", name, v) }
	str("OP_DECIDE", opDecide)
	str("OP_MERGED", opMerged)
	str("OP_UNDO", opUndo)
	str("OP_GIVEBACK", opGiveBack)
	for _, a := range []struct {
		name string
		pos  int64
	}{{"ARG_OP", argOp}, {"ARG_NOW", argNow}, {"ARG_THRESHOLD", argThreshold}, {"ARG_MULTI", argMulti},
		{"ARG_VALUES", argValues}, {"ARG_MERGED", argMerged}, {"ARG_UNDO", argUndo}, {"ARG_GIVEBACK", argGiveBack}} {
		num(a.name, a.pos)
	}
	num("FLAG_REFUND", flagRefund)
	num("FLAG_MODE", flagMode)
	num("MODE_SPAN", modeSpan)
	num("FLAG_OVERDRAFT", flagOverdraft)
	num("FLAG_ALG", flagAlg)
	num("ALG_SPAN", algSpan)
	num("FLAG_SHARED", flagShared)
	num("MODE_ENFORCE", int64(backend.Enforce))
	num("MODE_QUOTA", int64(backend.Quota))
	num("ALG_GCRA", int64(limit.GCRA))
	num("ALG_FIXED_WINDOW", int64(limit.FixedWindow))
	num("ALG_SLIDING_WINDOW", int64(limit.SlidingWindow))
	num("ALG_SLIDING_LOG", int64(limit.SlidingLog))
	num("MAX_TOLERANCE", int64(limit.MaxTolerance/time.Microsecond))
	num("MAX_WINDOW_CHARGE", limit.MaxWindowCharge)
	num("MAX_WINDOW_COUNT", limit.MaxWindowCount)
	num("SPAN_CAP", spanCap)
	num("FAST_FLAGS", fastFlags)
	str("DOUBLE_FMT", "<d") // a record's first field alone
	for _, r := range records {
		fmt.Fprintf(&b, "local %s_FMT, %s_WORDS, %s_BYTES = %q, %d, %d -- %s\n", r.lua, r.lua, r.lua,
			"<"+strings.Repeat("d", len(r.fields)), len(r.fields), 8*len(r.fields), strings.Join(r.fields, ", "))
	}
	return b.String()
}
