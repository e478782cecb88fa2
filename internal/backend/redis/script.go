package redis

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
)

// decideLua defines the script's functions and run, which runs one call; it reads the
// contract (contract.go) from the constants luaConstants renders before it.
//
//go:embed decide.lua
var decideLua string

// scriptCode is the script's definitions: the contract's constants, then decide.lua.
var scriptCode = luaConstants() + decideLua

// scriptSource is the script as EVAL runs it: the definitions, then the call.
var scriptSource = scriptCode + "return run(KEYS, ARGV)\n"

var script = goredis.NewScript(scriptSource)

// scriptHash is the script's SHA1, for EVALSHA.
var scriptHash = script.Hash()

// The script's hash and the library's function name as command arguments: boxed once, where
// boxing them per call would allocate.
var scriptHashArg, functionNameArg any = scriptHash, functionName

// shaArg returns sha as a command argument, without allocating when it is scriptHash.
func shaArg(sha string) any {
	if sha == scriptHash {
		return scriptHashArg
	}
	return sha
}

// library returns the script as a library of Redis Functions named name, whose one function,
// also name, runs a call.
func library(name string) string {
	return "#!lua name=" + name + "\n" + scriptCode + "redis.register_function('" + name + "', run)\n"
}

// functionName names the library and its function after a hash of the library's text, so that
// versions of rls whose libraries differ each call their own, and a library of that name is
// this one.
var functionName = func() string {
	h := sha1.Sum([]byte(library("rls")))
	return "rls_" + hex.EncodeToString(h[:8])
}()

// librarySource is the script as a library of Redis Functions (Redis 7 and later). Redis builds
// the script's functions once, when the library loads, where EVAL builds them on every call:
// about a third of a lone decision's time in Redis. rls calls the library (FCALL) when every
// master took it, and the script (EVALSHA) otherwise.
var librarySource = library(functionName)

// libraryRetry is how long after a failed load of the library (a timeout, a Redis out of
// memory) it is loaded again, while calls go as EVALSHA.
const libraryRetry = time.Second

func newScriptCmd(args []any) *goredis.Cmd {
	return scriptCmdIn(new(goredis.Cmd), args)
}

// scriptCmdIn makes dst a new script command of args, as newScriptCmd does, in place: a call
// keeps its command for the next (see call.cmd). The command must be done with.
func scriptCmdIn(dst *goredis.Cmd, args []any) *goredis.Cmd {
	*dst = *goredis.NewCmd(context.Background(), args...)
	dst.SetFirstKeyPos(3)
	return dst
}

// isReply reports whether err is an error reply from Redis rather than a failed round trip.
func isReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && !isNetwork(err)
}

func isNetwork(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// unavailableReplies are the error replies that say Redis cannot serve any call now: loading,
// failing over, refusing this client's credentials or permissions.
var unavailableReplies = []string{
	"LOADING", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "TRYAGAIN", "BUSY", "MISCONF",
	"NOAUTH", "WRONGPASS", "NOPERM", "NOREPLICAS", "OOM",
}

// redirectReply reports whether err is a Cluster redirect (MOVED, ASK): the call ran nothing; its
// slot is served by another node.
func redirectReply(err error) bool {
	if err == nil {
		return false // without asking HasErrorPrefix, which allocates
	}
	return goredis.HasErrorPrefix(err, "MOVED") || goredis.HasErrorPrefix(err, "ASK")
}

// redirect returns the address a MOVED or ASK reply sends to, and whether it is an ASK.
func redirect(err error) (addr string, ask, ok bool) {
	if !redirectReply(err) {
		return "", false, false
	}
	var re goredis.Error
	if !errors.As(err, &re) {
		return "", false, false
	}
	f := strings.Fields(re.Error())
	if len(f) != 3 {
		return "", false, false
	}
	return f[2], f[0] == "ASK", true
}

// unavailableReply reports whether err is an error reply that says Redis cannot serve calls.
func unavailableReply(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range unavailableReplies {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// classify wraps a call's error: one that says Redis is unavailable (no connection, timed out on
// the wire, an unavailable reply) wraps backend.ErrUnavailable; any other (a script error, a
// bug) is returned as it is, for the service to answer INTERNAL.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if isReply(err) && !unavailableReply(err) && !redirectReply(err) {
		return fmt.Errorf("redis: %w", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, goredis.ErrPoolTimeout) {
		// The callers' budgets passed before the call was written: overload (see observe).
		return errShed
	}
	return &unavailableError{kind: kindOf(err), err: err}
}

// unavailableError is a failed call: it wraps backend.ErrUnavailable and the cause, and its text
// names the kind of failure only, with no addresses.
type unavailableError struct {
	kind string
	err  error
}

func (e *unavailableError) Error() string { return "redis " + e.kind }

func (e *unavailableError) Unwrap() []error { return []error{backend.ErrUnavailable, e.err} }

func kindOf(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case unavailableReply(err), redirectReply(err):
		msg := err.Error()
		if i := strings.IndexByte(msg, ' '); i > 0 {
			msg = msg[:i]
		}
		return "unavailable (" + msg + ")"
	case errors.Is(err, goredis.ErrClosed):
		return "closed"
	}
	return "unreachable"
}

// fcallRefused says whether err refused FCALL itself: unknown (a Redis before 7, a proxy) or not
// permitted (an ACL). The call ran nothing.
func fcallRefused(err error) bool {
	return goredis.HasErrorPrefix(err, "unknown command") ||
		goredis.HasErrorPrefix(err, "NOPERM") && strings.Contains(strings.ToLower(err.Error()), "'fcall'")
}

// load puts the script into every master's script cache through c and, when library is set,
// its library of Redis Functions too. It reports whether every master holds the library, and
// refusal, when a master refused it for good (a Redis before 7, an ACL without FUNCTION, a proxy):
// a master that cannot take it now (out of memory, loading, read-only) is neither.
func load(ctx context.Context, c goredis.UniversalClient, library bool) (loaded bool, refusal error, err error) {
	var mu sync.Mutex
	missing := false
	each := func(ctx context.Context, n goredis.Cmdable) error {
		if err := script.Load(ctx, n).Err(); err != nil {
			return err
		}
		if !library {
			return nil
		}
		// Without REPLACE, a library already there is not compiled again (its name is a hash of
		// its text, so it is this one): the breaker's probes load it every cooldown.
		err := n.FunctionLoad(ctx, librarySource).Err()
		if err == nil || goredis.HasErrorPrefix(err, "Library '"+functionName+"' already exists") {
			return nil
		}
		if !isReply(err) {
			return err
		}
		mu.Lock()
		missing = true
		if !unavailableReply(err) || fcallRefused(err) || goredis.HasErrorPrefix(err, "unknown subcommand") {
			refusal = err
		}
		mu.Unlock()
		return nil
	}
	if cc, ok := c.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return each(ctx, n) })
	} else {
		err = each(ctx, c)
	}
	if err != nil {
		return false, nil, err
	}
	return library && !missing, refusal, nil
}
