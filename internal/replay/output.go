package replay

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// timeOf renders µs since the epoch in RFC 3339, UTC.
func timeOf(us int64) string { return time.UnixMicro(us).UTC().Format(time.RFC3339) }

func percent(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*float64(n)/float64(of), 'f', 1, 64) + "%"
}

// Summary is the report's first lines, in words.
func (rep *Report) Summary() []string {
	lines := []string{fmt.Sprintf("replayed %d requests from %d lines (%d skipped)", rep.Requests, rep.Lines, rep.Skipped)}
	if rep.Requests > 0 {
		lines[0] += fmt.Sprintf(", %s to %s", timeOf(rep.Start), timeOf(rep.End))
	}
	for s, name := range rep.Names {
		lines = append(lines, fmt.Sprintf("%s: %d answered OVER_LIMIT (%s)", name, rep.Denied[s], percent(rep.Denied[s], rep.Requests)))
	}
	if len(rep.Names) == 2 {
		lines = append(lines, fmt.Sprintf("%s instead of %s: %d requests newly denied, %d newly admitted",
			rep.Names[1], rep.Names[0], rep.NewlyDenied, rep.NewlyAdmitted))
	}
	return lines
}

// topString lists up to n keys of top inline.
func topString(top []KeyCount, n int) string {
	var parts []string
	for _, k := range top[:min(n, len(top))] {
		parts = append(parts, fmt.Sprintf("%s (%s)", k.Key, k.Count()))
	}
	return strings.Join(parts, ", ")
}

// WriteTable writes the report as a table for a terminal: per rule, the requests it answered
// for, its would-be denials and its most denied keys (with --compare, under both rule sets).
func (rep *Report) WriteTable(w io.Writer) error {
	for _, l := range rep.Summary() {
		fmt.Fprintln(w, l)
	}
	for _, e := range rep.Errors {
		fmt.Fprintln(w, "skipped:", e)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(rep.Names) == 2 {
		fmt.Fprintln(tw, "DOMAIN\tRULE\tREQUESTS\tDENIED\tDENIED (COMPARE)\tNEWLY DENIED\tNEWLY ADMITTED\tTOP DENIED (COMPARE)")
		for _, r := range rep.Rules {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Domain, r.Rule, max(r.Requests[0], r.Requests[1]),
				r.Denied[0], r.Denied[1], r.NewlyDenied, r.NewlyAdmitted, topString(r.Top[1], 3))
		}
	} else {
		fmt.Fprintln(tw, "DOMAIN\tRULE\tREQUESTS\tDENIED\tDENIED %\tTOP DENIED")
		for _, r := range rep.Rules {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", r.Domain, r.Rule, r.Requests[0], r.Denied[0],
				percent(r.Denied[0], r.Requests[0]), topString(r.Top[0], 3))
		}
	}
	return tw.Flush()
}

// WriteCSV writes the report as CSV: a row per rule and rule set (key empty), then a row per
// top denied key of it, with how much its count may overstate (denied_over: 0 when exact).
func (rep *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"domain", "rule", "rule_set", "key", "requests", "denied", "newly_denied", "newly_admitted", "denied_over"})
	for _, r := range rep.Rules {
		for s, name := range rep.Names {
			nd, na := "", ""
			if s == 1 {
				nd, na = strconv.FormatInt(r.NewlyDenied, 10), strconv.FormatInt(r.NewlyAdmitted, 10)
			}
			_ = cw.Write([]string{r.Domain, r.Rule, name, "", strconv.FormatInt(r.Requests[s], 10),
				strconv.FormatInt(r.Denied[s], 10), nd, na, ""})
			for _, k := range r.Top[s] {
				_ = cw.Write([]string{r.Domain, r.Rule, name, k.Key, "", strconv.FormatInt(k.Denied, 10), "", "",
					strconv.FormatInt(k.Over, 10)})
			}
		}
	}
	cw.Flush()
	return cw.Error()
}
