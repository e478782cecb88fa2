package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// sendPipeline runs calls in one pipeline and gives each its reply or error; it is the
// coalescer's send. On a single node, consecutive calls go out as one merged script call; on a
// Cluster each call is its own script call. It reports what Redis did to the node's breaker: it
// is the only place that learns whether the node answers. A leader's pipeline (lead) has its
// socket reads bounded by deadline too (see leadHook): one cut short there ran out of its
// caller's budget, which says nothing about Redis, as for a call abandoned in flight; it
// reports that (ranOut), with no call's reply to read, and tells the breaker nothing.
func (n *node) sendPipeline(calls []*call, deadline time.Time, lead bool) (ranOut bool) {
	if len(calls) == 0 {
		return false
	}
	b := n.deps
	if lead {
		n.leadOnce.Do(n.startLead)
	}
	ctx := newSendCtx(deadline, lead && n.leadOK)
	defer ctx.release()
	cmds, asking := ctx.cmds, ctx.asking
	now := b.nowArg()
	merged := b.merge && !b.cluster && len(calls) > 1
	if merged {
		cmds = append(cmds, scriptCmdIn(&calls[0].cmd, mergedArgs(scriptHash, now, calls)))
	} else {
		for _, c := range calls {
			cmds = append(cmds, scriptCmdIn(&c.cmd, decideArgs(scriptHash, now, c)))
			if c.asking {
				if len(asking) == 0 {
					asking = append(asking, make([]bool, len(calls))...)
				}
				asking[len(cmds)-1] = true
			}
		}
	}
	ctx.cmds, ctx.asking = cmds, asking
	if len(asking) == 0 {
		asking = nil
	}
	err := n.exec(ctx, cmds, asking)
	if lead && err != nil && !time.Now().Before(deadline) {
		return true
	}
	n.observe(err, cmds)
	for k, cmd := range cmds {
		g := calls[k : k+1]
		if merged {
			g = calls
		}
		if err := cmd.Err(); err != nil {
			for _, c := range g {
				c.err = classify(err)
			}
			continue
		}
		reply, ok := cmd.Val().(string)
		var derr error
		switch {
		case !ok:
			derr = fmt.Errorf("script reply: %T, want a string", cmd.Val())
		case merged:
			derr = decodeMerged(reply, g)
		default:
			derr = decodeDecide(reply, g[0])
		}
		for _, c := range g {
			c.err = derr
		}
	}
	return false
}

// leadKey marks a leader's pipeline in its context (see leadHook).
type leadKey struct{}

// startLead adds a leadHook to the node's client, at its first leader's pipeline. Every node's
// client is a *goredis.Client (newClient, newNodeClient); were it not, leaders' reads would be
// bounded by the socket timeout only.
func (n *node) startLead() {
	c, ok := n.rdb.(*goredis.Client)
	if !ok {
		return
	}
	lc := c.WithTimeout(c.Options().ReadTimeout)
	lc.Options().ContextTimeoutEnabled = true // its own copy of the options
	c.AddHook(leadHook{lc})
	n.leadOK = true
}

// leadHook runs the commands of a leader's pipeline (marked by leadKey) on c: the node's client
// on its own connections, with its context's deadline bounding socket reads and writes too, as
// the probe's client does. The connection of a read cut short is closed, so only a pipeline that
// carries nothing but its caller's calls may go that way. go-redis hooks do not follow a client
// to its WithTimeout copy, so the commands go through the node's client and its hooks, and only
// at the last of them, this one, to c: added at the first leader, it sees the hooks added
// before it (tests' counters) and not those added later.
type leadHook struct{ c *goredis.Client }

func (h leadHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h leadHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if ctx.Value(leadKey{}) == nil {
			return next(ctx, cmd)
		}
		return h.c.Process(ctx, cmd)
	}
}

func (h leadHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if ctx.Value(leadKey{}) == nil {
			return next(ctx, cmds)
		}
		pipe := h.c.Pipeline()
		for _, c := range cmds {
			_ = pipe.Process(ctx, c)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
}

// exec sends cmds in one pipeline, as FCALL while the library is loaded (see librarySource) and
// as EVALSHA otherwise, and sends again, as EVAL, those that found the script or the library
// missing: a restart, a failover, SCRIPT FLUSH or FUNCTION FLUSH empties them, and EVAL both runs
// the script and caches it again. A call that found its script missing, or FCALL refused, ran
// nothing, so this is safe; nothing else is ever sent twice. A missing library is loaded again in
// the background; until then calls go as EVALSHA. asking, when set, marks the commands to send
// after ASKING (a slot being migrated to this node). exec returns the error of the round trip
// itself (no connection, a timeout), if any; each command carries its own error as well.
func (n *node) exec(ctx context.Context, cmds []*goredis.Cmd, asking []bool) error {
	b := n.deps
	fcall := b.fcall.Load()
	if fcall {
		for _, c := range cmds {
			a := c.Args()
			a[0], a[1] = "fcall", functionNameArg
		}
	}
	if err := n.pipeline(ctx, cmds, asking); err != nil {
		return err
	}
	var again []*goredis.Cmd
	var againAsking []bool
	var lost bool
	var refused error
	for i, c := range cmds {
		err := c.Err()
		if err == nil {
			continue
		}
		gone := fcall && goredis.HasErrorPrefix(err, "Function not found")
		refuse := fcall && fcallRefused(err)
		if refuse {
			refused = err
		}
		if gone || refuse || goredis.HasErrorPrefix(err, "NOSCRIPT") {
			lost = lost || gone
			args := append([]any(nil), c.Args()...)
			args[0], args[1] = "eval", scriptSource
			cmds[i] = newScriptCmd(args)
			again = append(again, cmds[i])
			againAsking = append(againAsking, asking != nil && asking[i])
		}
	}
	switch {
	case refused != nil:
		// A node that took the library knows no FCALL (a proxy, a failover to an older Redis)
		// or may not run it (an ACL).
		b.refuseLibrary(refused)
	case lost:
		b.reloadLibrary()
	case !fcall && b.libraryWanted() && b.mono() >= b.libraryNext.Load():
		b.reloadLibrary()
	}
	if len(again) > 0 {
		if asking == nil {
			againAsking = nil
		}
		return n.pipeline(ctx, again, againAsking)
	}
	return nil
}

// pipeline sends cmds in one round trip; each command carries its own error. It returns the
// error of the round trip itself, when it failed. A command marked in asking goes after an
// ASKING.
func (n *node) pipeline(ctx context.Context, cmds []*goredis.Cmd, asking []bool) error {
	if len(cmds) == 1 && asking == nil {
		if err := n.rdb.Process(ctx, cmds[0]); err != nil {
			if cmds[0].Err() == nil {
				cmds[0].SetErr(err)
			}
			if !isReply(err) {
				return err
			}
		}
		return nil
	}
	pipe := n.rdb.Pipeline()
	for i, c := range cmds {
		if asking != nil && asking[i] {
			_ = pipe.Process(ctx, goredis.NewStatusCmd(ctx, "asking"))
		}
		_ = pipe.Process(ctx, c)
	}
	_, err := pipe.Exec(ctx)
	if err != nil && !isReply(err) {
		// Not a reply: the round trip itself failed.
		for _, c := range cmds {
			if c.Err() == nil {
				c.SetErr(err)
			}
		}
		return err
	}
	return nil
}
