package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/respguard"
)

// hostileRedis serves just enough RESP for a go-redis client to connect (HELLO, CLIENT, and, as
// its own sentinel, SENTINEL), and answers every other command with reply.
func hostileRedis(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				rd := bufio.NewReader(c)
				for {
					var args []string
					line, err := rd.ReadString('\n')
					if err != nil || !strings.HasPrefix(line, "*") {
						return
					}
					var n int
					fmt.Sscanf(line, "*%d", &n)
					for range n {
						if _, err := rd.ReadString('\n'); err != nil {
							return
						}
						a, err := rd.ReadString('\n')
						if err != nil {
							return
						}
						args = append(args, strings.ToUpper(strings.TrimSpace(a)))
					}
					out := reply
					switch {
					case args[0] == "HELLO":
						out = "%1\r\n$5\r\nproto\r\n:3\r\n"
					case args[0] == "CLIENT":
						out = "+OK\r\n"
					case args[0] == "SENTINEL" && len(args) > 1 && args[1] == "GET-MASTER-ADDR-BY-NAME":
						out = fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(host), host, len(port), port)
					case args[0] == "SENTINEL":
						out = "*0\r\n"
					}
					if _, err := c.Write([]byte(out)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestRepliesBounded: a client of every topology (NewClient, which RLQS uses, as the backend's
// own clients do: they share newClient and newClusterClient) fails a command whose reply
// declares more than respguard allows, with respguard's error, and allocates nothing like it.
func TestRepliesBounded(t *testing.T) {
	for _, tc := range []struct{ url, reply string }{
		{"redis://%s", "$2147483000\r\n"},
		{"redis-sentinel://%s/mymaster", "*2147483000\r\n"},
		{"redis-cluster://%s", "*2147483000\r\n"}, // the reply to CLUSTER SLOTS
		{"redis://%s", "%1073741000\r\n"},
		{"redis://%s", strings.Repeat("*1\r\n", 100000)},
	} {
		addr := hostileRedis(t, tc.reply)
		target, err := ParseURL(fmt.Sprintf(tc.url, addr))
		if err != nil {
			t.Fatal(err)
		}
		c := NewClient(target, time.Second, time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = c.Do(ctx, "get", "k").Err() // a generic reply: go-redis reads whatever it declares
		cancel()
		c.Close()
		var ge *respguard.Error
		if !errors.As(err, &ge) {
			t.Errorf("%s answering %.20q: GET returned %.80v, want respguard's refusal", target, tc.reply, err)
		}
	}
}
