package top

// summary is a space-saving heavy-hitter summary (Metwally, Agrawal and El Abbadi, 2005) of one
// rule's keys over one slot of time: at most m counters, kept in a min-heap by count.
//
// A key it counts is reported with count ≥ its true hits and count − err ≤ them; a key not
// counted has had at most min() hits, and err ≤ min() ≤ total/m always. A key whose true hits
// exceed total/m is always counted. Denials are counted from when a key got its counter:
// its true denials are between denials and denials + err.
type summary struct {
	slot   int64     // the slot of time counted (time / slot length); -1: never used
	total  int64     // exact hits of the slot
	denied int64     // exact denials of the slot
	cs     []counter // the counters, each in its place for good
	heap   []int32   // places in cs, a min-heap by count
	index  []int32   // places in cs by key hash, open addressing; -1: empty
	mask   uint64    // len(index) - 1
}

// counter is one key's.
type counter struct {
	hash      uint64
	count     int64 // hits, an overestimate by at most err
	err       int64
	denials   int64 // since the counter was taken
	remaining int64 // what its last decision left
	limit     int64 // the burst of that decision's limit
	pos       int32 // its place in heap
	n         uint8 // the length of ident
	cut       bool  // ident is the key's first identBytes bytes
	// ident is the key's identity (keyIdentity), rendered only when reported: held here,
	// rather than as a string, it takes no allocation and the counters no scan by the GC.
	ident [identBytes]byte
}

// identBytes bounds the identity a counter keeps of its key.
const identBytes = 128

func (c *counter) setIdent(ident string) {
	c.cut = len(ident) > identBytes
	c.n = uint8(copy(c.ident[:], ident))
}

// text renders the counter's key.
func (c *counter) text() string { return descriptorText(string(c.ident[:c.n]), c.cut) }

func newSummary(m int) *summary {
	n := 4
	for n < 2*m {
		n *= 2
	}
	s := &summary{slot: -1, cs: make([]counter, 0, m), heap: make([]int32, 0, m), index: make([]int32, n), mask: uint64(n - 1)}
	s.reset(-1)
	return s
}

// find returns the place in index of the key hashed h, or of the empty place where it would go.
// The index is at most half full, so the probe is short and always ends.
func (s *summary) find(h uint64) (uint64, bool) {
	for i := h & s.mask; ; i = (i + 1) & s.mask {
		c := s.index[i]
		if c < 0 {
			return i, false
		}
		if s.cs[c].hash == h {
			return i, true
		}
	}
}

// remove empties place p of index, moving back the entries after it that probed past it.
func (s *summary) remove(p uint64) {
	for j := (p + 1) & s.mask; s.index[j] >= 0; j = (j + 1) & s.mask {
		home := s.cs[s.index[j]].hash & s.mask
		// The entry at j may fill p unless its home lies cyclically in (p, j].
		if (j > p && (home <= p || home > j)) || (j < p && home <= p && home > j) {
			s.index[p] = s.index[j]
			p = j
		}
	}
	s.index[p] = -1
}

// reset empties s to count slot.
func (s *summary) reset(slot int64) {
	s.slot, s.total, s.denied = slot, 0, 0
	s.cs, s.heap = s.cs[:0], s.heap[:0]
	for i := range s.index {
		s.index[i] = -1
	}
}

// min is the count a key not in s may have had at most.
func (s *summary) min() int64 {
	if len(s.cs) < cap(s.cs) || len(s.cs) == 0 {
		return 0
	}
	return s.cs[s.heap[0]].count
}

// add counts an observation of the key hashed h, whose identity is ident.
func (s *summary) add(h uint64, o *Observation, ident string) {
	w := max(o.Cost, 1)
	s.total += w
	var den int64
	if o.Denied {
		den = w
		s.denied += w
	}
	p, ok := s.find(h)
	if ok {
		c := &s.cs[s.index[p]]
		c.count += w
		c.denials += den
		c.remaining, c.limit = o.Remaining, o.Limit
		s.down(int(c.pos))
		return
	}
	if len(s.cs) < cap(s.cs) {
		i := int32(len(s.cs))
		s.cs = s.cs[:i+1]
		c := &s.cs[i]
		*c = counter{hash: h, count: w, denials: den, remaining: o.Remaining, limit: o.Limit, pos: i}
		c.setIdent(ident)
		s.heap = append(s.heap, i)
		s.index[p] = i
		s.up(int(i))
		return
	}
	// The key with the least count gives its counter up; the newcomer inherits that count as
	// its possible error.
	i := s.heap[0]
	c := &s.cs[i]
	q, _ := s.find(c.hash)
	s.remove(q)
	c.hash, c.err, c.count, c.denials = h, c.count, c.count+w, den
	c.remaining, c.limit = o.Remaining, o.Limit
	c.setIdent(ident)
	p, _ = s.find(h) // the removal may have moved the empty place
	s.index[p] = i
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
