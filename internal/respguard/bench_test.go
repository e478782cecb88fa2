package respguard

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"testing"
)

// replyStream is what a pipelined Redis connection of a rate-limit service reads: script
// replies (one packed string each: 8 bytes a charged record, 32 a key's decision, for 1 to 4
// keys), now and then an integer, a status, and an aggregate of a few strings.
func replyStream() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 1<<20; i++ {
		n := 8 + 32*(1+i%4)
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", n, bytes.Repeat([]byte{byte(i)}, n))
		switch i % 16 {
		case 3:
			b.WriteString(":1\r\n")
		case 7:
			b.WriteString("+OK\r\n")
		case 11:
			b.WriteString("*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$40\r\n0123456789012345678901234567890123456789\r\n")
		}
	}
	return b.Bytes()
}

// BenchmarkCheck is the guard alone over 4 KiB reads, as a 4 KiB bufio.Reader fills.
func BenchmarkCheck(b *testing.B) {
	p := replyStream()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		var s Stream
		for i := 0; i < len(p); i += 4096 {
			if _, err := s.Check(p[i:min(i+4096, len(p))]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// chunked reads src 4 KiB at a time, as a socket gives what has arrived.
type chunked struct{ r *bytes.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), 4096)]) }

// guarded is Conn's Read over any reader.
type guarded struct {
	r io.Reader
	s Stream
}

func (g *guarded) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 {
		if k, gerr := g.s.Check(p[:n]); gerr != nil {
			return k, gerr
		}
	}
	return n, err
}

// BenchmarkReplies reads the stream's replies as a client does (a line, then a string's bytes),
// through a bufio.Reader, without and with the guard between it and the socket.
func BenchmarkReplies(b *testing.B) {
	p := replyStream()
	for _, guard := range []bool{false, true} {
		b.Run(map[bool]string{false: "bare", true: "guarded"}[guard], func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			buf := make([]byte, 1024)
			for b.Loop() {
				var r io.Reader = chunked{bytes.NewReader(p)}
				if guard {
					r = &guarded{r: r}
				}
				rd := bufio.NewReaderSize(r, 4096)
				for {
					line, err := rd.ReadSlice('\n')
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					if line[0] == '$' {
						n := 0
						for _, c := range line[1 : len(line)-2] {
							n = n*10 + int(c-'0')
						}
						if _, err := io.ReadFull(rd, buf[:n+2]); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
		})
	}
}
