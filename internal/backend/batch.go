package backend

import "github.com/rls-project/rls/internal/limit"

// DecideBatch decides reqs as one unit, all or nothing, at now (µs since the Unix epoch), and
// reports whether the batch is charged (Charged(reqs, out)); the answer to give is
// Admitted(reqs, out). states[i] is the stored state of
// reqs[i].Key before the batch; every occurrence of one key carries the same state. It writes
// out[i] and next[i] for every i (len(out), len(next) ≥ len(reqs)); a later occurrence of a key
// decides on the state its earlier occurrences left. When charged, the state to store for a key
// is next[i] of its last occurrence (Fresh(now): delete it), overdraft charges that went over
// included (into debt); when refused, nothing is stored,
// every next[i] is states[i], and every allowed decision reports a check (cost 0) of states[i].
// Denied decisions report the state they saw. Refunds are always allowed.
//
// Requests under a Concurrency limit (see DecideSlot) are decided with the others, all or
// nothing: a batch that a rate refuses acquires and releases no slot, and one that a slot
// refuses charges no rate. A batch charged but not admitted (overdraft charges that went over)
// keeps its rates' charges and acquires no slot. A slot's Quota mode counts as Enforce.
//
// DecideBatch is the one statement of the batch rules: every backend stores what it says. It
// allocates nothing; finding a key's earlier occurrence is a scan, quadratic in len(reqs), which
// costs less than any index for batches of a few dozen requests.
func DecideBatch(states []State, reqs []Request, now int64, out []Decision, next []State) bool {
	for i := range reqs {
		r := &reqs[i]
		cur := states[i]
		for j := i - 1; j >= 0; j-- {
			if reqs[j].Key == r.Key {
				cur = next[j]
				break
			}
		}
		if r.Limit.Algorithm == limit.Concurrency {
			next[i], out[i] = DecideSlot(cur, r, now)
		} else if r.Refund {
			next[i], out[i] = Refund(cur, r.Limit, now, r.Cost)
		} else {
			next[i], out[i] = Decide(cur, r.Limit, now, r.Cost)
		}
	}
	slots := HoldsSlots(reqs)
	if !slots && Charged(reqs, out) {
		return true
	}
	if slots && verdict(reqs, out, false, slotParts) && verdict(reqs, out, true, rateParts) {
		if verdict(reqs, out, false, rateParts) {
			return true
		}
		// Charged but not admitted (overdraft charges went over): the rates' charges stand,
		// and the request holds no slot.
		for i := range reqs {
			if reqs[i].Limit.Algorithm == limit.Concurrency {
				next[i] = states[i]
				if out[i].Allowed {
					out[i] = checkSlot(states[i], &reqs[i], now)
				}
			}
		}
		return true
	}
	for i := range reqs {
		next[i] = states[i]
		if out[i].Allowed && reqs[i].Limit.Algorithm == limit.Concurrency {
			out[i] = checkSlot(states[i], &reqs[i], now)
		} else if out[i].Allowed {
			// A check of the state the batch found. Under a rate above 0, Refund of 0 and Decide
			// of 0 give the same decision; under a rate of 0 only refunds are allowed, and a
			// refund stays allowed.
			_, out[i] = Refund(states[i], reqs[i].Limit, now, 0)
		}
	}
	return false
}
