package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Diagnostics of TestClusterMasterFault, off unless RLS_STALL_DIR is set. Then the replicas
// serve pprof (--debug), and the test writes under RLS_STALL_DIR, a directory per subtest:
//   - a goroutine dump (debug=2) of a replica whenever three or more of its calls on keys of the
//     healthy masters have been unanswered for 700 ms (at most six per replica, 150 ms apart);
//   - with RLS_STALL_TRACE=fault, an execution trace of every replica for 4 s from just before
//     the fault; with RLS_STALL_TRACE=late, one of 2 s from a replica's first late dump;
//   - answers.txt (every call: replica, kind of key, sent and took relative to the fault, its
//     code) and each replica's log.
//
// RLS_RACE_BIN=1 (harness_test.go) runs rls built with the race detector from a test binary
// built without it, as scripts/test's -race run does, without the callers' own slowdown.
var stallDir = os.Getenv("RLS_STALL_DIR")

type stallDiag struct {
	dir   string
	procs []*rlsProc
	start time.Time

	mu       sync.Mutex
	inflight map[*cfAnswer]bool
	skip     func(*cfAnswer) bool // answers the watch does not count (the failed master's keys)
	dumps    map[int]int
	lastDump map[int]time.Time
	traced   map[int]bool
	done     chan struct{}
	wg       sync.WaitGroup
}

func newStallDiag(name string, procs []*rlsProc, skip func(*cfAnswer) bool) *stallDiag {
	if stallDir == "" {
		return nil
	}
	dir := filepath.Join(stallDir, strings.ReplaceAll(name, "/", "_")+"-"+time.Now().Format("150405"))
	os.MkdirAll(dir, 0o755)
	d := &stallDiag{dir: dir, procs: procs, skip: skip, start: time.Now(), inflight: map[*cfAnswer]bool{},
		dumps: map[int]int{}, lastDump: map[int]time.Time{}, traced: map[int]bool{}, done: make(chan struct{})}
	d.wg.Go(d.watch)
	return d
}

func (d *stallDiag) begin(a *cfAnswer) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.inflight[a] = true
	d.mu.Unlock()
}

func (d *stallDiag) end(a *cfAnswer) {
	if d == nil {
		return
	}
	d.mu.Lock()
	delete(d.inflight, a)
	d.mu.Unlock()
}

func (d *stallDiag) fetch(replica int, path, file string) {
	resp, err := http.Get("http://" + d.procs[replica].DebugAddr + path)
	if err != nil {
		os.WriteFile(filepath.Join(d.dir, file+".err"), []byte(err.Error()), 0o644)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	os.WriteFile(filepath.Join(d.dir, file), b, 0o644)
}

func (d *stallDiag) watch() {
	for {
		select {
		case <-d.done:
			return
		case <-time.After(10 * time.Millisecond):
		}
		now := time.Now()
		late := map[int]int{}
		d.mu.Lock()
		for a := range d.inflight {
			if (d.skip == nil || !d.skip(a)) && now.Sub(a.sent) > 700*time.Millisecond {
				late[a.replica]++
			}
		}
		for r, n := range late {
			if n < 3 || d.dumps[r] >= 6 || now.Sub(d.lastDump[r]) < 150*time.Millisecond {
				continue
			}
			d.dumps[r]++
			d.lastDump[r] = now
			at := now.Sub(d.start).Milliseconds()
			d.wg.Go(func() {
				d.fetch(r, "/debug/pprof/goroutine?debug=2", fmt.Sprintf("r%d-%06dms-late%d.goroutines", r, at, n))
			})
			if !d.traced[r] && os.Getenv("RLS_STALL_TRACE") == "late" {
				d.traced[r] = true
				d.wg.Go(func() { d.fetch(r, "/debug/pprof/trace?seconds=2", fmt.Sprintf("r%d-%06dms.trace", r, at)) })
			}
		}
		d.mu.Unlock()
	}
}

// traceAll takes an execution trace of every replica from now, for seconds.
func (d *stallDiag) traceAll(seconds int) {
	if d == nil || os.Getenv("RLS_STALL_TRACE") != "fault" {
		return
	}
	at := time.Since(d.start).Milliseconds()
	for r := range d.procs {
		d.wg.Go(func() {
			d.fetch(r, fmt.Sprintf("/debug/pprof/trace?seconds=%d", seconds), fmt.Sprintf("r%d-%06dms.trace", r, at))
		})
	}
}

// finish stops the watch and writes every answer, by replica and time sent.
func (d *stallDiag) finish(answers []cfAnswer, faultAt time.Time, owner map[string]string, failed string) {
	if d == nil {
		return
	}
	close(d.done)
	d.wg.Wait()
	sort.Slice(answers, func(i, j int) bool { return answers[i].sent.Before(answers[j].sent) })
	var b strings.Builder
	fmt.Fprintf(&b, "# start at %s (fault at %+dms from start)\n", d.start.Format(time.RFC3339Nano), faultAt.Sub(d.start).Milliseconds())
	for _, a := range answers {
		kind := "healthy"
		if a.tight {
			kind = "tight"
		} else if owner[a.value] == failed {
			kind = "failed"
		}
		fmt.Fprintf(&b, "r%d %s %s sent%+dms took=%dms %v %v %s\n", a.replica, kind, a.value, a.sent.Sub(faultAt).Milliseconds(),
			a.recv.Sub(a.sent).Milliseconds(), a.code, a.overall, a.msg)
	}
	os.WriteFile(filepath.Join(d.dir, "answers.txt"), []byte(b.String()), 0o644)
	for i, p := range d.procs {
		os.WriteFile(filepath.Join(d.dir, fmt.Sprintf("r%d.log", i)), []byte(p.Output()), 0o644)
	}
}
