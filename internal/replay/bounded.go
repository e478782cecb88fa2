package replay

import (
	"cmp"
	"container/heap"
	"slices"
	"strings"
)

// keyCounts counts a rule's denied keys in at most m counters: exactly while no more than m
// keys were denied, then as space-saving does (Metwally, Agrawal and El Abbadi, 2005; the
// summary behind /debug/top, internal/top): a key not counted takes the counter of the key
// counted least, and that count as the most its own may overstate. A key denied more than
// total/m times is always counted, and a count overstates by at most total/m. A month of logs
// with millions of denied keys holds m of them.
type keyCounts struct {
	m     int
	index map[string]*keyCount
	heap  countHeap
}

// keyCount is a key's counter: its denials, an overstatement by at most over.
type keyCount struct {
	key          string
	denied, over int64
	place        int // in heap
}

// countHeap is the counters, a min-heap by count (container/heap).
type countHeap []*keyCount

func (h countHeap) Len() int           { return len(h) }
func (h countHeap) Less(i, j int) bool { return h[i].denied < h[j].denied }
func (h countHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].place, h[j].place = i, j }
func (h *countHeap) Push(x any)        { k := x.(*keyCount); k.place = len(*h); *h = append(*h, k) }
func (h *countHeap) Pop() any          { old := *h; k := old[len(old)-1]; *h = old[:len(old)-1]; return k }

func newKeyCounts(m int) *keyCounts {
	return &keyCounts{m: max(m, 1), index: map[string]*keyCount{}}
}

// add counts a denial of key.
func (c *keyCounts) add(key string) {
	if k := c.index[key]; k != nil {
		k.denied++
		heap.Fix(&c.heap, k.place)
		return
	}
	if len(c.heap) < c.m {
		k := &keyCount{key: key, denied: 1}
		c.index[key] = k
		heap.Push(&c.heap, k)
		return
	}
	least := c.heap[0]
	delete(c.index, least.key)
	least.key, least.over, least.denied = key, least.denied, least.denied+1
	c.index[key] = least
	heap.Fix(&c.heap, 0)
}

// top returns the n keys counted most, most first (ties by key).
func (c *keyCounts) top(n int) []KeyCount {
	kc := make([]KeyCount, 0, len(c.heap))
	for _, k := range c.heap {
		kc = append(kc, KeyCount{Key: k.key, Denied: k.denied, Over: k.over})
	}
	slices.SortFunc(kc, func(a, b KeyCount) int {
		return cmp.Or(cmp.Compare(b.Denied, a.Denied), strings.Compare(a.Key, b.Key))
	})
	return kc[:min(len(kc), n)]
}

// maxSpans bounds the spans of time a rule's series holds while a replay runs: per second up to
// about four and a half hours of logs, then per span twice as long each time the bound is
// reached. The report draws at most maxBuckets spans, so a month of logs loses nothing it shows.
const maxSpans = 1 << 14

// series counts a rule's admitted and denied descriptors per span of width seconds.
type series struct {
	width int64               // seconds a span: a power of two
	spans map[int64]*[2]int64 // admitted, denied, by time / width
	last  int64               // the span of the last count, whose counts are lastB
	lastB *[2]int64
}

func newSeries() *series { return &series{width: 1, spans: map[int64]*[2]int64{}} }

// at returns the counts of the span holding sec, seconds since the epoch.
func (s *series) at(sec int64) *[2]int64 {
	i := floorDiv(sec, s.width)
	if s.lastB != nil && i == s.last {
		return s.lastB
	}
	b := s.spans[i]
	if b == nil {
		if len(s.spans) >= maxSpans {
			s.coarsen()
			i = floorDiv(sec, s.width)
			b = s.spans[i]
		}
		if b == nil {
			b = new([2]int64)
			s.spans[i] = b
		}
	}
	s.last, s.lastB = i, b
	return b
}

// coarsen doubles the width of s's spans, adding each pair's counts together.
func (s *series) coarsen() {
	s.width *= 2
	spans := make(map[int64]*[2]int64, len(s.spans)/2+1)
	for i, b := range s.spans {
		j := floorDiv(i, 2)
		if c := spans[j]; c != nil {
			c[0] += b[0]
			c[1] += b[1]
		} else {
			spans[j] = b
		}
	}
	s.spans, s.lastB = spans, nil
}

// floorDiv is a / b rounded down, b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
