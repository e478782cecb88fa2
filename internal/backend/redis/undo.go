package redis

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
)

// The undo: what the calls of a decision charged, given back when the batch was refused across
// Cluster slots (in the caller's time) or failed (out of it).

// undoFailed gives back, out of the caller's time, what the replied calls of a failed send
// charged (some node charged its part of a decision that failed), and reports whether it took
// j to do so: j then never goes back to the pool.
func (b *core) undoFailed(j *job, reqs []backend.Request) bool {
	charged := false
	for k := range j.calls {
		c := &j.calls[k]
		charged = charged || !j.unread[c] && c.err == nil && c.charged
	}
	if !charged {
		return false
	}
	rs := append([]backend.Request(nil), reqs...)
	b.work.spawn(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, max(b.timeout, time.Second))
		defer cancel()
		if uerr := j.undo(ctx, b, rs, j.unread); uerr != nil {
			b.log.Debug("redis: the charges of a failed decision were not given back", "err", uerr)
		}
	})
	return true
}

// undo gives back what the charged calls of j wrote, but for those in skip, on the nodes that
// charged them.
func (j *job) undo(ctx context.Context, h hasCore, reqs []backend.Request, skip map[*call]bool) error {
	b := h.decisions()
	type nodeUndo struct {
		n    *node
		cmds []*goredis.Cmd
	}
	var undos []nodeUndo
	for k := range j.calls {
		c := &j.calls[k]
		if skip[c] || !c.charged || c.err != nil {
			continue
		}
		c.charged = false
		var keys []string
		var vals []byte
		for n, i := range j.idx[k] {
			var ok bool
			if vals, ok = c.appendUndo(vals, n, &reqs[i]); ok {
				keys = append(keys, c.keys[n])
			}
		}
		if len(keys) == 0 {
			continue
		}
		n := c.node
		if n == nil {
			n = b.single
		}
		u := slices.IndexFunc(undos, func(u nodeUndo) bool { return u.n == n })
		if u < 0 {
			undos = append(undos, nodeUndo{n: n})
			u = len(undos) - 1
		}
		undos[u].cmds = append(undos[u].cmds, newScriptCmd(undoArgs(script.Hash(), b.nowArg(), keys, vals)))
	}
	var wg sync.WaitGroup
	for _, u := range undos {
		wg.Go(func() { u.n.observe(u.n.exec(ctx, u.cmds, nil), u.cmds) })
	}
	wg.Wait()
	var err error
	for _, u := range undos {
		for _, c := range u.cmds {
			if cerr := c.Err(); cerr != nil && err == nil {
				err = classify(cerr)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("undoing the charges of a refused batch: %w", err)
	}
	return nil
}
