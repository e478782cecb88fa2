package descriptors

import (
	"fmt"
	"strconv"
	"time"

	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/statekey"
)

// singularTag is the KeyTag of a rule's singular rate_limit: the "#0" its keys have always
// ended with, so that no key of such a rule changes whatever its name, period or rate.
const singularTag = "0"

// concurrencyTag is the KeyTag of a rule's concurrency limit: no rate limit's tag ("0", "n…",
// "p…") nor an override's ("o…") is it, so its slots never share a key with a rate's state.
const concurrencyTag = "c"

// listTag is the KeyTag of a limit of a rate_limits list: what the limit is, never where it
// stands in the list nor its rate. A named limit is its name, length-prefixed ("n5:daily"); an
// unnamed one its period and algorithm ("p86400s/gcra"), and, for a fixed_window whose windows
// are aligned otherwise than Period-long from the epoch, what aligns them: an offset ("+345600s",
// a UTC week from Monday) or a calendar unit and zone ("/month@Asia/Tokyo"), since two windows
// of one period aligned apart count different hits. The first letter tells the forms apart, and
// none is "0" (singularTag) or begins with "o" (an override's key, see service.appendOverrideKey).
func listTag(l *Limit) string {
	if l.Name != "" {
		return string(statekey.AppendField([]byte{'n'}, l.Name))
	}
	b := make([]byte, 0, 32)
	b = append(b, 'p')
	b = appendSeconds(b, l.Spec.Period)
	b = append(b, '/')
	b = append(b, l.Spec.Algorithm.String()...)
	w := l.Spec.Window
	if w.Offset != 0 {
		b = append(b, '+')
		b = appendSeconds(b, time.Duration(w.Offset)*time.Microsecond)
	}
	if w.Calendar != limit.NoCalendar {
		b = append(b, '/')
		b = append(b, w.Calendar.String()...)
		b = append(b, '@')
		loc := "UTC"
		if w.Location != nil {
			loc = w.Location.String()
		}
		b = append(b, loc...)
	}
	return string(b)
}

// appendSeconds appends d as "<n>s", or in microseconds ("<n>us") when it is not whole
// seconds (no rule's period is, but the form stays unambiguous if one ever is).
func appendSeconds(b []byte, d time.Duration) []byte {
	if d%time.Second == 0 {
		return append(strconv.AppendInt(b, int64(d/time.Second), 10), 's')
	}
	return append(strconv.AppendInt(b, int64(d/time.Microsecond), 10), "us"...)
}

// what describes, for an error, the state an unnamed limit of a list is keyed by: its period as
// the file wrote it, its algorithm, and the zone of a calendar window.
func what(l *Limit) string {
	s := fmt.Sprintf("per %d %s", l.UnitMultiplier, l.Unit)
	if l.UnitMultiplier != 1 {
		s += "s"
	}
	s += " under " + l.Spec.Algorithm.String()
	if w := l.Spec.Window; w.Calendar != limit.NoCalendar && w.Location != nil {
		s += " in " + w.Location.String()
	}
	return s
}
