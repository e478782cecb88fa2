package statsd

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config says where and how a Sink sends.
type Config struct {
	Addr      string        // host:port of the statsd server, over UDP
	Interval  time.Duration // between flushes
	DogStatsD bool          // tags as DogStatsD's |#k:v; else in the name, as envoyproxy/ratelimit's statsd sink puts them
	Tags      []Tag         // added to every "ratelimit." counter (EXTRA_TAGS)
	// Mogrifiers rename counters and tag them, the first that matches, under DogStatsD.
	Mogrifiers []Mogrifier
}

// Tag is one extra tag.
type Tag struct{ Name, Value string }

// ParseTags reads EXTRA_TAGS' form, "name:value,name:value", sorted by name.
func ParseTags(s string) ([]Tag, error) {
	var tags []Tag
	if s == "" {
		return nil, nil
	}
	for i, item := range strings.Split(s, ",") {
		n, v, ok := strings.Cut(item, ":")
		if !ok || n == "" {
			return nil, fmt.Errorf("tag %d %q: want name:value", i+1, item)
		}
		tags = append(tags, Tag{n, v})
	}
	slices.SortStableFunc(tags, func(a, b Tag) int { return strings.Compare(a.Name, b.Name) })
	return tags, nil
}

// FormatTags is ParseTags' inverse.
func FormatTags(tags []Tag) string {
	var b strings.Builder
	for i, t := range tags {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(t.Name + ":" + t.Value)
	}
	return b.String()
}

// Mogrifier is one of envoyproxy/ratelimit's DogStatsD mogrifiers: a counter whose name matches
// Pattern is sent as Name, with Tags; $0, $1... in Name and the tags' values are Pattern's
// matches.
type Mogrifier struct {
	Pattern string            `json:"pattern"`
	Name    string            `json:"name"`
	Tags    map[string]string `json:"tags,omitempty"`
	re      *regexp.Regexp
}

// ParseMogrifiers reads a JSON list of mogrifiers, [{"pattern": ..., "name": ..., "tags": {...}}].
func ParseMogrifiers(s string) ([]Mogrifier, error) {
	if s == "" {
		return nil, nil
	}
	var ms []Mogrifier
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ms); err != nil {
		return nil, fmt.Errorf("want a JSON list of {\"pattern\", \"name\", \"tags\"}: %v", err)
	}
	for i := range ms {
		m := &ms[i]
		if m.Pattern == "" || m.Name == "" {
			return nil, fmt.Errorf("mogrifier %d: pattern and name are needed", i+1)
		}
		re, err := regexp.Compile(m.Pattern)
		if err != nil {
			return nil, fmt.Errorf("mogrifier %d: pattern: %v", i+1, err)
		}
		for k, v := range m.Tags {
			if k == "" || v == "" {
				return nil, fmt.Errorf("mogrifier %d: a tag with no name or no value", i+1)
			}
		}
		m.re = re
	}
	return ms, nil
}

var placeholder = regexp.MustCompile(`\$\d+`)

func expand(pattern string, matches []string) string {
	return placeholder.ReplaceAllStringFunc(pattern, func(s string) string {
		i, err := strconv.Atoi(s[1:])
		if err != nil || i >= len(matches) {
			return s
		}
		return matches[i]
	})
}

// mogrify applies the first mogrifier that matches name.
func mogrify(ms []Mogrifier, name string) (string, []string) {
	for _, m := range ms {
		matches := m.re.FindStringSubmatch(name)
		if matches == nil {
			continue
		}
		var tags []string
		for k, v := range m.Tags {
			tags = append(tags, k+":"+expand(v, matches))
		}
		slices.Sort(tags)
		return expand(m.Name, matches), tags
	}
	return name, nil
}

// maxDatagram bounds one UDP datagram's payload: under a 1500-byte MTU with IP and UDP headers,
// as statsd clients send.
const maxDatagram = 1432

// Sink sends a Store's counters, and derived ones from a gatherer, to a statsd server.
type Sink struct {
	cfg   Config
	store *Store
	gath  prometheus.Gatherer
	log   *slog.Logger
	conn  net.Conn

	last        map[*Series][nCounters]uint64
	lastDerived []uint64
	stop        chan struct{}
	done        chan struct{}
	once        sync.Once
	started     bool
	failed      bool // the last send failed: logged once until one succeeds
}

// NewSink returns a Sink that sends to cfg.Addr; Start sends. The address is resolved at the
// first flush, and at each flush after until it resolves: a statsd server whose name does not
// resolve yet (a sidecar or Service not up) costs counts, not the start.
func NewSink(cfg Config, store *Store, g prometheus.Gatherer, log *slog.Logger) (*Sink, error) {
	if cfg.Interval <= 0 {
		return nil, errors.New("statsd: the flush interval must be positive")
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("statsd %s: %w", cfg.Addr, err)
	}
	return &Sink{cfg: cfg, store: store, gath: g, log: log,
		last: map[*Series][nCounters]uint64{}, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start flushes every interval until Stop; call it once at most.
func (s *Sink) Start() {
	s.started = true
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.Flush()
			case <-s.stop:
				return
			}
		}
	}()
}

// Stop sends what is left and closes the socket; it waits for a flush under way.
func (s *Sink) Stop() {
	s.once.Do(func() {
		close(s.stop)
		if s.started {
			<-s.done
		}
		s.Flush()
		if s.conn != nil {
			s.conn.Close()
		}
	})
}

// Flush sends every counter that changed since the last flush. Not safe for concurrent use:
// the Sink's goroutine calls it, and Stop once that has ended.
func (s *Sink) Flush() {
	var pkt []byte
	send := func() {
		if len(pkt) == 0 {
			return
		}
		if s.conn == nil {
			c, err := net.Dial("udp", s.cfg.Addr)
			if err != nil {
				s.report(err)
				pkt = pkt[:0]
				return
			}
			s.conn = c
		}
		// A UDP write does not wait for the server; a short deadline still bounds a socket
		// buffer that is full.
		_ = s.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := s.conn.Write(pkt)
		s.report(err)
		pkt = pkt[:0]
	}
	add := func(name string, delta uint64, tagged bool) {
		line := s.line(name, delta, tagged)
		if len(pkt) > 0 && len(pkt)+1+len(line) > maxDatagram {
			send()
		}
		if len(pkt) > 0 {
			pkt = append(pkt, '\n')
		}
		pkt = append(pkt, line...)
	}
	for _, sr := range s.store.Series() {
		prev := s.last[sr]
		var now [nCounters]uint64
		for i := range now {
			now[i] = sr.c[i].Load()
			if d := now[i] - prev[i]; d > 0 {
				add("ratelimit.service.rate_limit."+sr.Key+"."+counterNames[i], d, true)
			}
		}
		s.last[sr] = now
	}
	if vals := readDerived(s.gath); vals != nil {
		if s.lastDerived == nil {
			s.lastDerived = make([]uint64, len(vals))
		}
		for i, v := range vals {
			if v > s.lastDerived[i] {
				add(derivedCounters[i].stat, v-s.lastDerived[i], derivedCounters[i].tagged)
			}
			s.lastDerived[i] = v
		}
	}
	send()
}

// report logs the first failure to send, and the first success after failures.
func (s *Sink) report(err error) {
	switch {
	case err != nil && !s.failed:
		s.failed = true
		s.log.Warn("statsd: sending failed; counters go on being sent every interval", "addr", s.cfg.Addr, "err", err)
	case err == nil && s.failed:
		s.failed = false
		s.log.Info("statsd: sending again", "addr", s.cfg.Addr)
	}
}

// line is one counter's statsd line.
func (s *Sink) line(name string, delta uint64, tagged bool) string {
	v := strconv.FormatUint(delta, 10)
	if !s.cfg.DogStatsD {
		if tagged {
			// envoyproxy/ratelimit's statsd sink (lyft/gostats) puts tags in the name.
			for _, t := range s.cfg.Tags {
				name += ".__" + t.Name + "=" + t.Value
			}
		}
		return name + ":" + v + "|c"
	}
	var tags []string
	if tagged {
		for _, t := range s.cfg.Tags {
			tags = append(tags, t.Name+":"+t.Value)
		}
	}
	name, mt := mogrify(s.cfg.Mogrifiers, name)
	tags = append(tags, mt...)
	if len(tags) == 0 {
		return name + ":" + v + "|c"
	}
	return name + ":" + v + "|c|#" + strings.Join(tags, ",")
}
