// Command hostile sends what a hostile but unauthenticated client can send rls, for load runs
// that measure ordinary clients beside it: gRPC messages of 4 MiB, messages just under
// --max-request-bytes full of empty descriptors, and POST /json bodies of the same, from -c
// workers in turn, for -d. It prints how many of each were sent and how they were answered.
//
//	go run ./integration/hostile -grpc 127.0.0.1:8081 -http 127.0.0.1:8080 -c 8 -d 4s
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

func emptyDescriptors(domain string, size int) []byte {
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), domain)
	for len(b)+2 <= size {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}

func main() {
	grpcAddr := flag.String("grpc", "127.0.0.1:8081", "rls's gRPC address")
	httpAddr := flag.String("http", "", "rls's HTTP address, for POST /json (empty: gRPC only)")
	domain := flag.String("domain", "load", "domain of the requests")
	size := flag.Int("size", 256<<10, "bytes of the messages of empty descriptors (rls's --max-request-bytes)")
	workers := flag.Int("c", 8, "concurrent workers")
	d := flag.Duration("d", 4*time.Second, "how long to send")
	flag.Parse()

	conn, err := grpc.NewClient(*grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	huge := emptyDescriptors(*domain, 4<<20)
	under := emptyDescriptors(*domain, *size-16)
	body := []byte(`{"domain":"` + *domain + `","descriptors":[` + strings.Repeat(`{},`, (*size-64)/3) + `{}]}`)
	kinds := []string{"grpc-4MiB", "grpc-empty-descriptors", "json-empty-descriptors"}
	var sent [3]atomic.Int64
	var mu sync.Mutex
	answers := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), *d)
	defer cancel()
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				k := i % len(kinds)
				if k == 2 && *httpAddr == "" {
					continue
				}
				var answer string
				switch k {
				case 0, 1:
					msg := &huge
					if k == 1 {
						msg = &under
					}
					var out []byte
					err := conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", msg, &out, grpc.ForceCodecV2(rawCodec{}))
					answer = status.Code(err).String()
				case 2:
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+*httpAddr+"/json", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						answer = "error"
						break
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					answer = fmt.Sprint(resp.StatusCode)
				}
				if ctx.Err() != nil {
					return
				}
				sent[k].Add(1)
				mu.Lock()
				answers[kinds[k]+" "+answer]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for k, name := range kinds {
		fmt.Printf("%s sent=%d\n", name, sent[k].Load())
	}
	for a, n := range answers {
		fmt.Printf("  %s: %d\n", a, n)
	}
}
