package replay

import (
	"cmp"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/rls-project/rls/internal/descriptors"
)

// Run replays inputs against one rule set, or two to compare them, and gathers the report.
type Run struct {
	// Sets are the engines: the rule set, and with --compare the other one.
	Sets []*Engine
	// Names name the rule sets in the report (their paths).
	Names []string
	// OnError is told each line that cannot be replayed; it returns whether to go on. Nil: stop
	// at the first.
	OnError func(*LineError) bool
	// TopKeys is how many denied keys each rule's report lists (0: 10).
	TopKeys int

	report Report
	byRule []map[*descriptors.Rule]*RuleStats
	stats  map[string]*RuleStats // by domain and path
	denied [2][]bool
}

// Report is what a replay found.
type Report struct {
	Names []string
	// Requests replayed, Lines read and Skipped (lines that could not be replayed).
	Requests, Lines, Skipped int64
	// Start and End are the first and last request's times, µs since the epoch.
	Start, End int64
	// Denied counts the requests answered OVER_LIMIT, per rule set.
	Denied []int64
	// NewlyDenied and NewlyAdmitted count the requests whose answer the second rule set changes.
	NewlyDenied, NewlyAdmitted int64
	// Rules, by domain and path.
	Rules []*RuleStats
	// Errors holds the first lines that could not be replayed (at most 20).
	Errors []string
}

// RuleStats is one rule's share of a replay, per rule set (index 0: --config, 1: --compare).
type RuleStats struct {
	Domain, Rule string
	// Requests counts the descriptors the rule answered for; Denied those its limit denied
	// (in shadow mode too).
	Requests, Denied []int64
	// NewlyDenied and NewlyAdmitted count the descriptors the second set denies and the first
	// admitted, and the other way round.
	NewlyDenied, NewlyAdmitted int64
	// Top are the keys most denied, most first.
	Top [][]KeyCount
	// Series are admitted and denied over time, in Buckets.
	Series [][]Bucket

	keys   []*keyCounts
	series []*series
}

// KeyCount is a descriptor and how many times it was denied: exactly when Over is 0, else
// between Denied - Over and Denied (see keyCounts).
type KeyCount struct {
	Key    string
	Denied int64
	Over   int64
}

// Count renders the denials: "123" when exact, else the span they lie in, "118-123".
func (k KeyCount) Count() string {
	if k.Over == 0 {
		return strconv.FormatInt(k.Denied, 10)
	}
	return strconv.FormatInt(k.Denied-k.Over, 10) + "-" + strconv.FormatInt(k.Denied, 10)
}

// Bucket is one span of time of a rule's series.
type Bucket struct {
	Start            int64 // µs since the epoch
	Admitted, Denied int64
}

// maxErrors bounds Report.Errors.
const maxErrors = 20

// Replay reads every request of rd and decides it in every set, Count times.
func (r *Run) Replay(rd *Reader) error {
	r.init()
	var req Request
	for {
		err := rd.Next(&req)
		if err == io.EOF {
			return nil
		}
		r.report.Lines++
		var le *LineError
		if errors.As(err, &le) {
			if !r.lineError(le) {
				return le
			}
			continue
		}
		if err != nil {
			return err
		}
		if err := r.Decide(&req); err != nil {
			le := &LineError{Name: rd.name, Line: req.Line, Err: err}
			if !r.lineError(le) {
				return le
			}
		}
	}
}

func (r *Run) lineError(le *LineError) bool {
	r.report.Skipped++
	if len(r.report.Errors) < maxErrors {
		r.report.Errors = append(r.report.Errors, le.Error())
	}
	return r.OnError != nil && r.OnError(le)
}

func (r *Run) init() {
	if r.stats != nil {
		return
	}
	n := len(r.Sets)
	r.stats = map[string]*RuleStats{}
	r.byRule = make([]map[*descriptors.Rule]*RuleStats, n)
	for i := range r.byRule {
		r.byRule[i] = map[*descriptors.Rule]*RuleStats{}
	}
	r.report.Names = r.Names
	r.report.Denied = make([]int64, n)
}

// Decide decides one request in every set, req.Count times, and counts the outcome. A domain
// no set defines is an error (ErrUnknownDomain), and nothing of the request is counted.
func (r *Run) Decide(req *Request) error {
	r.init()
	if err := req.Validate(); err != nil {
		return err
	}
	for _, e := range r.Sets {
		if !e.rs.HasDomain(req.Domain) {
			_, _, err := e.Decide(req)
			return err
		}
	}
	if r.report.Requests == 0 || req.Time < r.report.Start {
		r.report.Start = req.Time
	}
	r.report.End = max(r.report.End, req.Time)
	for range max(req.Count, 1) {
		r.report.Requests++
		var admitted [2]bool
		for s, e := range r.Sets {
			ok, items, err := e.Decide(req)
			if err != nil {
				return err
			}
			admitted[s] = ok
			if !ok {
				r.report.Denied[s]++
			}
			r.denied[s] = slices.Grow(r.denied[s][:0], len(req.Descs))[:len(req.Descs)]
			r.count(s, req, items)
		}
		if len(r.Sets) == 2 && admitted[0] != admitted[1] {
			if admitted[0] {
				r.report.NewlyDenied++
			} else {
				r.report.NewlyAdmitted++
			}
		}
	}
	return nil
}

// count counts set s's decision of req's descriptors.
func (r *Run) count(s int, req *Request, items []Item) {
	for i := range req.Descs {
		r.denied[s][i] = false
		best := Limiting(items, i)
		if best < 0 {
			continue
		}
		it := &items[best]
		st := r.ruleStats(s, it.Rule)
		st.Requests[s]++
		denied := !it.Decision.Allowed
		b := st.series[s].at(floorDiv(req.Time, 1e6))
		if denied {
			st.Denied[s]++
			b[1]++
			st.keys[s].add(descriptors.Text(req.Descs[i].Entries))
			r.denied[s][i] = true
		} else {
			b[0]++
		}
		if s == 1 && r.denied[0][i] != denied {
			if denied {
				st.NewlyDenied++
			} else {
				st.NewlyAdmitted++
			}
		}
	}
}

func (r *Run) ruleStats(s int, rule *descriptors.Rule) *RuleStats {
	if st := r.byRule[s][rule]; st != nil {
		return st
	}
	name := rule.Domain + "\x00" + rule.Path
	st := r.stats[name]
	if st == nil {
		n := len(r.Sets)
		st = &RuleStats{Domain: rule.Domain, Rule: rule.Path, Requests: make([]int64, n), Denied: make([]int64, n),
			Top: make([][]KeyCount, n), Series: make([][]Bucket, n), keys: make([]*keyCounts, n), series: make([]*series, n)}
		for i := range n {
			st.keys[i] = newKeyCounts(max(minCounted, countedPerListed*cmp.Or(r.TopKeys, 10)))
			st.series[i] = newSeries()
		}
		r.stats[name] = st
	}
	r.byRule[s][rule] = st
	return st
}

// maxBuckets is how many spans of time a rule's series has at most.
const maxBuckets = 60

// A rule's denied keys are counted exactly up to minCounted keys, or countedPerListed times
// the keys its report lists if more, and past that within total/m (see keyCounts).
const (
	minCounted       = 1024
	countedPerListed = 100
)

// Report returns what the replay found: the rules by domain and path, each with its top denied
// keys and its series in at most 60 spans of equal length.
func (r *Run) Report() *Report {
	r.init()
	rep := r.report
	rep.Rules = rep.Rules[:0]
	top := cmp.Or(r.TopKeys, 10)
	// The report's spans hold whole spans of every series: their width and start are multiples
	// of the widest series' (1 s unless a run held more than maxSpans of them).
	var unit int64 = 1
	for _, st := range r.stats {
		for _, se := range st.series {
			unit = max(unit, se.width)
		}
	}
	first := floorDiv(floorDiv(rep.Start, 1e6), unit) * unit // seconds
	span := floorDiv(rep.End, 1e6) - first + 1
	width := (span + maxBuckets - 1) / maxBuckets // seconds a bucket
	width = (width + unit - 1) / unit * unit
	n := (span + width - 1) / width
	for _, st := range r.stats {
		for s := range r.Sets {
			st.Top[s] = st.keys[s].top(top)
			series := make([]Bucket, n)
			for i := range series {
				series[i].Start = (first + int64(i)*width) * 1e6
			}
			se := st.series[s]
			for j, b := range se.spans {
				i := (j*se.width - first) / width
				if i < 0 || i >= n {
					continue
				}
				series[i].Admitted += b[0]
				series[i].Denied += b[1]
			}
			st.Series[s] = series
		}
		rep.Rules = append(rep.Rules, st)
	}
	slices.SortFunc(rep.Rules, func(a, b *RuleStats) int {
		return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Rule, b.Rule))
	})
	return &rep
}
