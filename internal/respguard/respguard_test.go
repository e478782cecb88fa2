package respguard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"testing"
)

// gen writes random valid RESP2/RESP3 replies, its choices drawn from next.
type gen struct {
	next   func(n int) int // a choice in [0, n)
	depth  int
	budget int // values left to draw before aggregates are drawn empty
}

func (g *gen) value(b *bytes.Buffer) {
	g.budget--
	kinds := 16
	if g.depth >= 6 || g.budget <= 0 {
		kinds = 9 // scalars only
	}
	switch g.next(kinds) {
	case 0:
		fmt.Fprintf(b, "+%s\r\n", g.text(40))
	case 1:
		fmt.Fprintf(b, "-ERR %s\r\n", g.text(40))
	case 2:
		fmt.Fprintf(b, ":%d\r\n", int64(g.next(1<<30))-1<<29)
	case 3:
		fmt.Fprintf(b, ",%d.%d\r\n", g.next(1000), g.next(1000))
	case 4:
		b.WriteString([]string{"#t\r\n", "#f\r\n", "_\r\n", "(3492890328409238509324850943850943825024385\r\n", ",inf\r\n"}[g.next(5)])
	case 5, 6:
		s := g.bulk()
		fmt.Fprintf(b, "%c%d\r\n%s\r\n", "$=!"[g.next(3)], len(s), s)
	case 7:
		b.WriteString([]string{"$-1\r\n", "*-1\r\n", "%-1\r\n", "$0\r\n\r\n", "*0\r\n", "%0\r\n"}[g.next(6)])
	case 8:
		fmt.Fprintf(b, "$%d\r\n%s\r\n", 5, "a\r\nb\n") // CRLF inside a bulk string
	default:
		kind := "*~>%|"[g.next(5)]
		n := g.next(6)
		if g.next(8) == 0 {
			n = g.next(300)
		}
		fmt.Fprintf(b, "%c%d\r\n", kind, n)
		if kind == '%' || kind == '|' {
			n *= 2
		}
		g.depth++
		for range n {
			g.value(b)
		}
		g.depth--
		if kind == '|' {
			g.value(b) // the value the attribute precedes
		}
	}
}

func (g *gen) text(max int) string {
	var sb strings.Builder
	for range g.next(max) {
		sb.WriteByte(" abc:$*%_0123456789"[g.next(19)])
	}
	return sb.String()
}

func (g *gen) bulk() string {
	n := g.next(20)
	if g.next(50) == 0 {
		n = g.next(70000) // longer than a reader's buffer
	}
	p := make([]byte, n)
	v := byte(g.next(256))
	for i := range p {
		p[i] = v + byte(i)*7 // every byte value, '\r' and '\n' among them
	}
	return string(p)
}

// stream returns a valid stream of replies drawn from next.
func stream(next func(int) int, replies int) []byte {
	var b bytes.Buffer
	g := &gen{next: next, budget: 500}
	for range replies {
		g.value(&b)
	}
	return b.Bytes()
}

// checkAll runs s over p in pieces cut at cuts, and returns how many bytes passed and the error.
func checkAll(p []byte, cuts []int) (int, error) {
	var s Stream
	passed, prev := 0, 0
	for _, c := range append(cuts, len(p)) {
		n, err := s.Check(p[prev:c])
		passed += n
		if err != nil {
			return passed, err
		}
		prev = c
	}
	return passed, nil
}

// atRest reports whether a stream that took p ends between replies.
func atRest(t *testing.T, p []byte) {
	t.Helper()
	var s Stream
	if n, err := s.Check(p); n != len(p) || err != nil {
		t.Fatalf("valid stream refused after %d of %d bytes: %v", n, len(p), err)
	}
	if s.state != stType || s.depth != 0 || s.pending != 0 {
		t.Fatalf("valid stream ends in state %d depth %d pending %d, want between replies", s.state, s.depth, s.pending)
	}
}

func TestValidStreamsPass(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 100 {
		p := stream(r.IntN, 1+r.IntN(20))
		atRest(t, p)
		// Split at every byte boundary for the short ones, at random ones for the others.
		if len(p) < 800 {
			for c := 1; c < len(p); c++ {
				if n, err := checkAll(p, []int{c}); n != len(p) || err != nil {
					t.Fatalf("stream %d split at %d: %d of %d bytes passed: %v", i, c, n, len(p), err)
				}
			}
		}
		var cuts []int
		for c := 0; c < len(p); c += 1 + r.IntN(64) {
			cuts = append(cuts, c)
		}
		if n, err := checkAll(p, cuts); n != len(p) || err != nil {
			t.Fatalf("stream %d in %d pieces: %d of %d bytes passed: %v", i, len(cuts), n, len(p), err)
		}
	}
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		passed      int // bytes that pass before the refusal
	}{
		{"bulk", "$2147483000\r\n", 9},
		{"verbatim", "=67108865\r\n", 8},
		{"blob error", "!99999999999\r\n", 8},
		{"array", "*2147483000\r\n", 7},
		{"set", "~1048577\r\n", 7},
		{"push", ">1048577\r\n", 7},
		{"map of pairs past the bound", "%524289\r\n", 8},
		{"attribute", "|600000\r\n", 8},
		{"nested counts add up", "*2\r\n*1048575\r\n", 13},
		{"after replies within bounds", "+OK\r\n:1\r\n$3\r\nabc\r\n*2\r\n$1\r\na\r\n*9999999\r\n", 36},
		{"leading zeros", "$" + strings.Repeat("0", 30) + "1\r\n", 21},
		{"negative length", "$-2\r\n", 4},
		{"no digits", "*\r\n", 1},
		{"streamed string", "$?\r\n", 1},
		{"not RESP", "HTTP/1.1 400 Bad Request\r\n", 0},
		{"length without LF", "$3\rabc", 3},
		{"deep nesting", strings.Repeat("*1\r\n", MaxDepth+1), 4*MaxDepth + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := []byte(tc.reply)
			for c := 0; c <= len(p); c++ {
				n, err := checkAll(p, []int{c})
				var ge *Error
				if !errors.As(err, &ge) {
					t.Fatalf("split at %d: %d bytes passed, err %v: want refused", c, n, err)
				}
				if n != tc.passed {
					t.Fatalf("split at %d: %d bytes passed before %v, want %d", c, n, err, tc.passed)
				}
			}
		})
	}
	// At the bounds exactly, passed.
	for _, ok := range []string{
		fmt.Sprintf("$%d\r\n", MaxBulk),
		fmt.Sprintf("*%d\r\n", MaxPending),
		fmt.Sprintf("%%%d\r\n", MaxPending/2),
		"*2\r\n*1048574\r\n",
		strings.Repeat("*1\r\n", MaxDepth),
		"$000000000000000003\r\nabc\r\n",
	} {
		if n, err := checkAll([]byte(ok), nil); n != len(ok) || err != nil {
			t.Errorf("%q: %d bytes passed, %v: want passed", ok, n, err)
		}
	}
}

func TestLongLineRefused(t *testing.T) {
	var s Stream
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	if _, err := s.Check([]byte("+")); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		_, err := s.Check(chunk)
		if err != nil {
			if i*len(chunk) > MaxLine {
				t.Fatalf("refused only after %d bytes", i*len(chunk))
			}
			break
		}
	}
	if _, err := s.Check([]byte("\r\n")); err == nil {
		t.Fatal("a refused stream passed again")
	}
}

// TestConn reads through Wrap over a real socket: valid replies pass, a refusal is the Read's
// error after the bytes before it, and the socket is still a syscall.Conn.
func TestConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("+OK\r\n$3\r\nabc\r\n*2147483000\r\n:1\r\n"))
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := Wrap(raw)
	defer c.Close()
	if _, ok := c.(syscall.Conn); !ok {
		t.Fatal("a guarded TCP connection is not a syscall.Conn")
	}
	got, err := io.ReadAll(c)
	var ge *Error
	if !errors.As(err, &ge) {
		t.Fatalf("read %q, %v: want refused", got, err)
	}
	if want := "+OK\r\n$3\r\nabc\r\n*214748"; string(got) != want {
		t.Fatalf("read %q before the refusal, want %q", got, want)
	}
	if n, err := c.Read(make([]byte, 10)); n != 0 || err != ge {
		t.Fatalf("read after a refusal: %d, %v: want 0 and the same error", n, err)
	}
	if _, ok := Wrap(struct{ net.Conn }{raw}).(syscall.Conn); ok {
		t.Fatal("a connection that is no syscall.Conn became one")
	}
}

// FuzzSplit holds that how a stream is cut into reads does not change what passes: a valid
// stream (drawn from the fuzzer's bytes) passes whole at every cut, and any bytes pass as far,
// and fail alike, however they are cut.
func FuzzSplit(f *testing.F) {
	f.Add([]byte("*3\r\n$5\r\nhello\r\n:42\r\n%1\r\n+a\r\n_\r\n"), uint16(7))
	f.Add([]byte("$2147483000\r\n"), uint16(3))
	f.Add([]byte("|1\r\n+k\r\n+v\r\n*1\r\n#t\r\n"), uint16(9))
	f.Add([]byte{0, 1, 2, 3, 200, 100, 7, 9, 11, 13, 99}, uint16(1))
	f.Fuzz(func(t *testing.T, in []byte, cut uint16) {
		// in as a stream of its own: cut anywhere, the same bytes pass and the same failure.
		whole, werr := checkAll(in, nil)
		for c := 0; c <= len(in); c++ {
			n, err := checkAll(in, []int{c})
			if n != whole || (err == nil) != (werr == nil) {
				t.Fatalf("%q cut at %d: %d bytes passed (%v), whole %d (%v)", in, c, n, err, whole, werr)
			}
		}
		// in as the choices of a valid stream.
		k := 0
		next := func(n int) int {
			if len(in) == 0 {
				return 0
			}
			v := int(in[k%len(in)]) | int(in[(k+1)%len(in)])<<8
			k += 2
			if k > 4*len(in)+64 {
				return 0 // run out of choices: close what is open
			}
			return v % n
		}
		p := stream(next, 1+int(cut%4))
		atRest(t, p)
		c := int(cut) % (len(p) + 1)
		if n, err := checkAll(p, []int{c}); n != len(p) || err != nil {
			t.Fatalf("valid stream cut at %d: %d of %d bytes passed: %v", c, n, len(p), err)
		}
	})
}
