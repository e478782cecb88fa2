// Package respguard bounds what a Redis server's replies can make a client allocate. A RESP
// reply declares its sizes before it sends them (a bulk string's length, an aggregate's count),
// and a client library allocates what is declared: 13 bytes, "$2147483000\r\n", make it allocate
// 2 GB before a byte of the string arrives. Wrap follows the stream of replies on a connection
// as it is read and fails the read that would deliver a declaration past a bound, so the library
// never sees it: a rogue or corrupted server fails its connection, not the process.
//
// The guard copies nothing and buffers nothing: every byte a Read returns is the connection's,
// unchanged, and a valid stream within the bounds reads exactly as without the guard.
package respguard

import (
	"bytes"
	"fmt"
	"net"
	"syscall"
)

// The bounds. A client allocates a declared bulk string whole, and an aggregate's slots before
// its elements arrive (go-redis: 16 bytes an element of a slice, 40 MiB for the table of a map
// of MaxPending/2 pairs); what completed elements hold was sent, and is about as large as what
// was read. So a connection's reader holds at most about MaxBulk + 40 MiB more than it has
// received.
const (
	// MaxBulk is the longest bulk string ($), verbatim string (=) or blob error (!) a reply may
	// declare, in bytes. Redis's own bound on a string value is 512 MB, but a rate-limit
	// service reads nothing that long: its largest replies are packed script replies (32 bytes
	// a key and 8 a call: 1,024 coalesced calls of 64 descriptors with four limits each are
	// 8 MiB), INFO (tens of KB), and the cluster's slot map (tens of bytes a range, in strings
	// of their own). 64 MiB is eight times the largest of them.
	MaxBulk = 64 << 20
	// MaxPending is the most elements the aggregates a reply has opened may still declare
	// unreceived at once: an array (*), set (~) or push (>) counts its elements, a map (%) or
	// attribute (|) two a pair, and nested aggregates add up, so that neither one header nor a
	// chain of them makes the reader allocate more than 16 MiB of slots (40 MiB of a map's). The largest aggregates
	// a rate-limit service reads are the cluster's slot map (at most 16,384 ranges) and a hash
	// of RLQS proxies (two elements a proxy); 1<<20 is 64 times the first.
	MaxPending = 1 << 20
	// MaxDepth is the deepest aggregates may nest. A client's reader recurses once a level, and
	// a reply of ten million "*1" would overflow its stack; the replies of Redis commands nest
	// four or five deep.
	MaxDepth = 64
	// MaxLine is the longest line a reply may send: a simple string, an error, a number, or a
	// length. Readers buffer a line until its end, so a line that never ends would grow without
	// bound; Redis's replies are lines of a few hundred bytes at most (an error with its script
	// location).
	MaxLine = 1 << 20
)

// Error is the error of a Read that met a reply past a bound or not in RESP.
type Error struct {
	Reason string
}

func (e *Error) Error() string { return "redis reply refused: " + e.Reason }

// Wrap returns c with its reads guarded. The connection is the caller's to close; a Read that
// meets a reply past a bound returns the bytes before it and the error, and every later Read
// returns the same error (the stream cannot be followed further).
//
// When c is a syscall.Conn (a TCP or unix socket), so is the result: client libraries peek at
// the socket to check a pooled connection is alive, which sees what the guard will see.
func Wrap(c net.Conn) net.Conn {
	g := &Conn{Conn: c}
	if _, ok := c.(syscall.Conn); ok {
		return sysConn{g}
	}
	return g
}

// Conn is a guarded connection (see Wrap).
type Conn struct {
	net.Conn
	s Stream
}

// Read reads from the connection and checks what it read (see Stream.Check).
func (c *Conn) Read(b []byte) (int, error) {
	if c.s.err != nil {
		return 0, c.s.err
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		if k, gerr := c.s.Check(b[:n]); gerr != nil {
			return k, gerr
		}
	}
	return n, err
}

// Unwrap returns the guarded connection.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

type sysConn struct{ *Conn }

func (c sysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.Conn.(syscall.Conn).SyscallConn()
}

// The states of a Stream: where in a reply the next byte falls.
const (
	stType   uint8 = iota // a value's type byte
	stLength              // a bulk string's or aggregate's length, after its type byte
	stLF                  // the '\n' after a length's '\r'
	stLine                // a line value's text, up to its '\n'
	stBulk                // a bulk string's bytes and their "\r\n"
)

// level is an open aggregate: the elements it still waits for.
type level struct {
	left int64
	attr bool // an attribute: it precedes a value and is no element of its own
}

// Stream follows a stream of RESP2 or RESP3 replies. Its zero value is at the start of a reply.
type Stream struct {
	state   uint8
	kind    byte  // the type byte of the length or line being read
	neg     bool  // the length began with '-'
	digits  int   // digits of the length read
	n       int64 // the length so far; stBulk: the bytes left
	max     int64 // the bound on the length being read
	line    int   // bytes of the current line
	depth   int
	pending int64 // the sum of levels[:depth].left
	levels  [MaxDepth]level
	err     error
}

// Check follows b, the next bytes of the stream. It returns len(b) and nil when b is within the
// bounds; otherwise the length of b's part before the byte that broke one, and the error, which
// every later Check returns too.
func (s *Stream) Check(b []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	i := 0
	for i < len(b) {
		switch s.state {
		case stBulk:
			if rest := int64(len(b) - i); rest < s.n {
				s.n -= rest
				return len(b), nil
			}
			i += int(s.n)
			s.n = 0
			s.state = stType
			s.value()
		case stLine:
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				s.line += len(b) - i
				if s.line > MaxLine {
					return i, s.fail("a line of more than %d bytes", MaxLine)
				}
				return len(b), nil
			}
			if s.line+j > MaxLine {
				return i, s.fail("a line of more than %d bytes", MaxLine)
			}
			i += j + 1
			s.state = stType
			s.value()
		case stType:
			c := b[i]
			switch c {
			case '+', '-', ':', ',', '#', '(', '_':
				s.state, s.line = stLine, 1
			case '$', '=', '!':
				s.state, s.kind, s.neg, s.digits, s.n, s.max = stLength, c, false, 0, 0, MaxBulk
			case '*', '~', '>', '%', '|':
				s.state, s.kind, s.neg, s.digits, s.n, s.max = stLength, c, false, 0, 0, MaxPending
			default:
				return i, s.fail("type byte %q is not RESP", c)
			}
			i++
		case stLength:
			for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
				s.n = s.n*10 + int64(b[i]-'0')
				s.digits++
				if s.n > s.max {
					return i, s.tooLarge()
				}
				if s.digits > 20 {
					return i, s.fail("a length of more than 20 digits")
				}
			}
			if i == len(b) {
				return len(b), nil
			}
			switch c := b[i]; {
			case c == '-' && s.digits == 0 && !s.neg:
				s.neg = true
			case c == '\r' && s.digits > 0:
				s.state = stLF
			default:
				return i, s.fail("a length of %q: want digits", c)
			}
			i++
		case stLF:
			if b[i] != '\n' {
				return i, s.fail("a length ends in %q: want \"\\r\\n\"", b[i])
			}
			i++
			if err := s.length(); err != nil {
				return i - 1, err
			}
		}
	}
	return len(b), nil
}

// length acts on a length read whole: a bulk string's bytes to skip, an aggregate to open.
func (s *Stream) length() error {
	s.state = stType
	if s.neg {
		if s.n != 1 {
			return s.fail("%c-%d: a negative length other than -1", s.kind, s.n)
		}
		s.value() // a null
		return nil
	}
	switch s.kind {
	case '$', '=', '!':
		if s.n > MaxBulk {
			return s.tooLarge()
		}
		s.state, s.n = stBulk, s.n+2
		return nil
	}
	n := s.n
	if s.kind == '%' || s.kind == '|' {
		n *= 2
	}
	if s.pending+n > MaxPending {
		return s.tooLarge()
	}
	if n == 0 {
		if s.kind != '|' {
			s.value()
		}
		return nil
	}
	if s.depth == MaxDepth {
		return s.fail("aggregates nested more than %d deep", MaxDepth)
	}
	s.levels[s.depth] = level{left: n, attr: s.kind == '|'}
	s.depth++
	s.pending += n
	return nil
}

// value counts a value completed in the aggregates that hold it.
func (s *Stream) value() {
	for s.depth > 0 {
		l := &s.levels[s.depth-1]
		l.left--
		s.pending--
		if l.left > 0 {
			return
		}
		s.depth--
		if l.attr {
			return // the value it precedes is still to come
		}
	}
}

// tooLarge fails a length past its bound (for a length still being read, the digits so far).
func (s *Stream) tooLarge() error {
	if s.max == MaxBulk {
		return s.fail("%c%d...: a string longer than %d bytes", s.kind, s.n, MaxBulk)
	}
	return s.fail("%c%d...: an aggregate whose elements, with %d already pending, are more than %d", s.kind, s.n, s.pending, MaxPending)
}

func (s *Stream) fail(format string, args ...any) error {
	s.err = &Error{Reason: fmt.Sprintf(format, args...)}
	return s.err
}
