package top

// summary is a space-saving heavy-hitter summary (Metwally, Agrawal and El Abbadi, 2005) of one
// rule's keys over one slot of time: at most m counters, kept in a min-heap by count.
//
// A key it counts is reported with count ≥ its true hits and count − err ≤ them; a key not
// counted has had at most min() hits, and err ≤ min() ≤ total/m always. A key whose true hits
// exceed total/m is always counted. Denials are counted from when a key got its counter:
// its true denials are between denials and denials + err.
type summary struct {
	slot   int64            // the slot of time counted (time / slot length); -1: never used
	total  int64            // exact hits of the slot
	denied int64            // exact denials of the slot
	cs     []counter        // the counters, each in its place for good
	heap   []int32          // places in cs, a min-heap by count
	index  map[uint64]int32 // key hash → place in cs
}

// counter is one key's.
type counter struct {
	hash      uint64
	count     int64 // hits, an overestimate by at most err
	err       int64
	denials   int64 // since the counter was taken
	remaining int64 // what its last decision left
	limit     int64 // the burst of that decision's limit
	text      string
	pos       int32 // its place in heap
}

func newSummary(m int) *summary {
	return &summary{slot: -1, cs: make([]counter, 0, m), heap: make([]int32, 0, m), index: make(map[uint64]int32, m)}
}

// reset empties s to count slot.
func (s *summary) reset(slot int64) {
	s.slot, s.total, s.denied = slot, 0, 0
	clear(s.cs[:cap(s.cs)]) // drop the texts
	s.cs, s.heap = s.cs[:0], s.heap[:0]
	clear(s.index)
}

// min is the count a key not in s may have had at most.
func (s *summary) min() int64 {
	if len(s.cs) < cap(s.cs) || len(s.cs) == 0 {
		return 0
	}
	return s.cs[s.heap[0]].count
}

// add counts an observation of the key hashed h; text renders the key, called only when the
// key takes a counter.
func (s *summary) add(h uint64, o *Observation, text func() string) {
	w := max(o.Cost, 1)
	s.total += w
	var den int64
	if o.Denied {
		den = w
		s.denied += w
	}
	if i, ok := s.index[h]; ok {
		c := &s.cs[i]
		c.count += w
		c.denials += den
		c.remaining, c.limit = o.Remaining, o.Limit
		s.down(int(c.pos))
		return
	}
	c := counter{hash: h, count: w, denials: den, remaining: o.Remaining, limit: o.Limit, text: text()}
	if len(s.cs) < cap(s.cs) {
		i := int32(len(s.cs))
		c.pos = i
		s.cs = append(s.cs, c)
		s.heap = append(s.heap, i)
		s.index[h] = i
		s.up(int(i))
		return
	}
	// The key with the least count gives its counter up; the newcomer inherits that count as
	// its possible error.
	i := s.heap[0]
	old := &s.cs[i]
	delete(s.index, old.hash)
	c.err = old.count
	c.count += old.count
	c.pos = 0
	*old = c
	s.index[h] = i
	s.down(0)
}

func (s *summary) less(i, j int) bool { return s.cs[s.heap[i]].count < s.cs[s.heap[j]].count }

func (s *summary) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.cs[s.heap[i]].pos = int32(i)
	s.cs[s.heap[j]].pos = int32(j)
}

func (s *summary) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *summary) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		small := l
		if r := l + 1; r < n && s.less(r, l) {
			small = r
		}
		if !s.less(small, i) {
			return
		}
		s.swap(i, small)
		i = small
	}
}
