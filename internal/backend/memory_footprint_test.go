package backend_test

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// TestMemoryFootprint measures what the memory backend costs per key: it fills a backend with
// RLS_FOOTPRINT_KEYS distinct keys of RLS_FOOTPRINT_KEYLEN bytes, each built as its own string
// as a request's key is, and logs the resident set (VmRSS after a forced GC that returns
// free memory to the OS, and the peak VmHWM) and the live heap per key. It runs only when
// RLS_FOOTPRINT_KEYS is set:
//
//	RLS_FOOTPRINT_KEYS=1000000 RLS_FOOTPRINT_KEYLEN=22 go test -run Footprint -v ./internal/backend
//
// RLS_FOOTPRINT_MAXKEYS and RLS_FOOTPRINT_MAXBYTES set the backend's bounds (default: large
// enough to keep every key).
func TestMemoryFootprint(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RLS_FOOTPRINT_KEYS"))
	if n <= 0 {
		t.Skip("set RLS_FOOTPRINT_KEYS to measure")
	}
	keyLen := 22
	if v, err := strconv.Atoi(os.Getenv("RLS_FOOTPRINT_KEYLEN")); err == nil {
		keyLen = v
	}
	opts := backend.MemoryOptions{Now: func() time.Time { return time.UnixMicro(1e15) }}
	if v, err := strconv.Atoi(os.Getenv("RLS_FOOTPRINT_MAXKEYS")); err == nil {
		opts.MaxKeys = v
	}
	opts.MaxBytes = 1 << 40
	if v, err := strconv.ParseInt(os.Getenv("RLS_FOOTPRINT_MAXBYTES"), 10, 64); err == nil {
		opts.MaxBytes = v
	}
	m, err := backend.NewMemory(opts)
	if err != nil {
		t.Fatal(err)
	}
	rss0, heap0 := settled()
	l := limit.Limit{Rate: 1000, Period: 24 * time.Hour, Burst: 1000}
	reqs := []backend.Request{{Limit: l, Cost: 1}}
	out := make([]backend.Decision, 1)
	pad := strings.Repeat("x", max(keyLen-12, 0))
	buf := make([]byte, 0, keyLen+16)
	for i := range n {
		buf = append(buf[:0], pad...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		reqs[0].Key = string(buf)
		if _, err := m.Decide(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
	}
	rss1, heap1 := settled()
	kept := m.Len()
	t.Logf("%d keys of %d bytes offered, %d kept (%d evicted, %.1f MB counted): RSS %.1f MB (%.0f B/key kept), live heap %.1f MB (%.0f B/key kept), peak RSS %.1f MB",
		n, keyLen, kept, m.Evictions(), float64(m.Bytes())/1e6, float64(rss1-rss0)/1e6, float64(rss1-rss0)/float64(kept),
		float64(heap1-heap0)/1e6, float64(heap1-heap0)/float64(kept), float64(status("VmHWM"))/1e6)
	runtime.KeepAlive(m)
}

// settled returns VmRSS and the live heap after a GC that returns free memory to the OS.
func settled() (rss, heap int64) {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return status("VmRSS"), int64(ms.HeapAlloc)
}

// status returns a /proc/self/status field in bytes.
func status(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
