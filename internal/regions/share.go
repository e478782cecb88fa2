package regions

import (
	"fmt"
	"slices"
	"strings"
)

// Share is a region's part of a global key's limit: Rate requests per the key's period and a
// GCRA burst of Burst requests. The zero Share admits nothing. A Share with Rate > 0 has
// Burst > 0 (see normal).
type Share struct {
	Rate  int64 `json:"r"`
	Burst int64 `json:"b"`
}

func (s Share) String() string { return fmt.Sprintf("%d/%d", s.Rate, s.Burst) }

// within reports whether s is at most o in both parts.
func (s Share) within(o Share) bool { return s.Rate <= o.Rate && s.Burst <= o.Burst }

func (s Share) max(o Share) Share { return Share{max(s.Rate, o.Rate), max(s.Burst, o.Burst)} }

func (s Share) min(o Share) Share { return Share{min(s.Rate, o.Rate), min(s.Burst, o.Burst)} }

func (s Share) add(o Share) Share { return Share{s.Rate + o.Rate, s.Burst + o.Burst} }

func (s Share) sub(o Share) Share { return Share{s.Rate - o.Rate, s.Burst - o.Burst} }

// normal is s, or the zero Share when either part is zero: a GCRA limit with a rate needs a
// burst of at least one request, and a burst without a rate never refills.
func (s Share) normal() Share {
	if s.Rate <= 0 || s.Burst <= 0 {
		return Share{}
	}
	return s
}

// Safe is the share a region falls to once its lease with the coordinator has ended: the
// coordinator counts the same share for it from the lease's end (plus the margin) on, so the
// bound holds under every choice; they differ in what the cut-off region and the others keep.
type Safe uint8

const (
	// SafeZero: a cut-off region admits nothing on global keys after its lease; the others
	// get its share once the lease has ended.
	SafeZero Safe = iota
	// SafeFair: a cut-off region keeps the smaller of its share and an equal split (r/N, b/N)
	// among the N regions it is told of; the others get the rest of its share.
	SafeFair
	// SafeLast: a cut-off region keeps its last share; no other region gets it until the region
	// is back (or, if it never comes back, until an operator removes it).
	SafeLast
)

var safeNames = [...]string{"zero", "fair", "last"}

func (s Safe) String() string {
	if int(s) < len(safeNames) {
		return safeNames[s]
	}
	return fmt.Sprintf("safe(%d)", s)
}

// ParseSafe parses a Safe's name.
func ParseSafe(name string) (Safe, error) {
	if i := slices.Index(safeNames[:], name); i >= 0 {
		return Safe(i), nil
	}
	return 0, fmt.Errorf("safe share %q: want one of %s", name, strings.Join(safeNames[:], ", "))
}

// Policy is what a region does once cut off: its Safe share, and for SafeFair the number of
// regions the limit is split among.
type Policy struct {
	Safe    Safe `json:"safe"`
	Regions int  `json:"n,omitempty"`
}

// share is the share a region that held held under lim uses (and is counted for) once cut off.
// It is never above held, so that falling to it is a cut.
func (p Policy) share(held, lim Share) Share {
	switch p.Safe {
	case SafeLast:
		return held
	case SafeFair:
		n := int64(max(p.Regions, 1))
		return held.min(Share{lim.Rate / n, lim.Burst / n}).normal()
	}
	return Share{}
}
