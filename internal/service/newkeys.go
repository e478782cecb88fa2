package service

import (
	"context"
	"hash/maphash"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/policy"
)

// The new-key gate bounds how many keys one caller can make the backend create a second
// (Options.MaxNewKeysPerCaller, --max-new-keys-per-caller).
//
// A key is new when this process has not let a request with it through in the last
// newKeyRotation to 2×newKeyRotation: the keys seen are remembered in two bitsets of
// newKeyBits bits each, by two bits of a hash (maphash, with a seed of this process), the
// current one written and both read, and every newKeyRotation the older is cleared and becomes
// the current. The memory is fixed (2 × 1 MiB) whatever the number of keys. A false positive (a
// new key whose bits are all set by others) only ever lets a key through as seen: the bound is
// approximate in the caller's favour, by the filter's false-positive rate (each bitset's fill
// squared, for the two: about 2% at 14,000 keys let through a second, 420,000 a bitset).
//
// Each caller has a GCRA budget of N new keys a second, burst N, decided by backend.Decide; a
// request whose new keys the budget cannot take is refused whole, and its keys stay new. Callers
// are kept in an LRU of newKeyCallers: a caller pushed out starts again with a full burst.
const (
	newKeyBits     = 1 << 23
	newKeyRotation = 30 * time.Second
	newKeyCallers  = 1 << 16
)

// newKeyGate is the new-key gate. Its methods are safe for concurrent use.
type newKeyGate struct {
	max  int64
	lim  limit.Limit
	seed maphash.Seed
	// start is when the gate was made: its clock is start's wall time plus the monotonic time
	// since, so that a wall clock set back does not hold the filter from rotating.
	start time.Time

	// mu is read-locked by a request whose keys are all marked in cur (the common case: it
	// reads bits only) and locked by any other, which may rotate, spend and mark.
	mu      sync.RWMutex
	cur     []atomic.Uint64 // written and read
	prev    []atomic.Uint64 // read only
	rotated int64           // unix µs of the last rotation
	callers *simplelru.LRU[string, *backend.State]
}

// newNewKeyGate returns a gate of max new keys a second per caller; nil for max 0 (no gate).
func newNewKeyGate(max int64, callers int) *newKeyGate {
	if max <= 0 {
		return nil
	}
	c, err := simplelru.NewLRU[string, *backend.State](callers, nil)
	if err != nil {
		panic(err) // callers > 0
	}
	return &newKeyGate{
		max:  max,
		lim:  limit.Limit{Rate: max, Period: time.Second, Burst: max},
		seed: maphash.MakeSeed(), start: time.Now(),
		cur: make([]atomic.Uint64, newKeyBits/64), prev: make([]atomic.Uint64, newKeyBits/64),
		callers: c,
	}
}

// hash returns the hash of key that the gate's filter reads and writes.
func (g *newKeyGate) hash(key string) uint64 { return maphash.String(g.seed, key) }

// bits are the two bit indexes of a key's hash in a bitset.
func bitsOf(h uint64) (uint64, uint64) { return h & (newKeyBits - 1), (h >> 32) & (newKeyBits - 1) }

func has(set []atomic.Uint64, h uint64) bool {
	a, b := bitsOf(h)
	return set[a/64].Load()&(1<<(a%64)) != 0 && set[b/64].Load()&(1<<(b%64)) != 0
}

func mark(set []atomic.Uint64, h uint64) {
	a, b := bitsOf(h)
	set[a/64].Or(1 << (a % 64))
	set[b/64].Or(1 << (b % 64))
}

// rotate forgets the older bitset when a rotation is due at now (µs); both when two are.
func (g *newKeyGate) rotate(now int64) {
	period := newKeyRotation.Microseconds()
	if g.rotated == 0 {
		g.rotated = now
		return
	}
	if now-g.rotated < period {
		return
	}
	if now-g.rotated >= 2*period {
		clear(g.cur)
	}
	clear(g.prev)
	g.prev, g.cur = g.cur, g.prev
	g.rotated = now
}

// admit decides a request whose keys hash to hashes, for the caller that caller names (called
// only when it is needed: when the request has a new key), at now (unix µs). It reports whether
// the request may go on, and the caller when it may not. A request let through marks its keys
// seen; a request whose keys are all seen is always let through.
func (g *newKeyGate) admit(hashes []uint64, caller func() string, now int64) (ok bool, who string) {
	g.mu.RLock()
	seen := g.rotated != 0 && now-g.rotated < newKeyRotation.Microseconds()
	for i := 0; seen && i < len(hashes); i++ {
		seen = has(g.cur, hashes[i])
	}
	g.mu.RUnlock()
	if seen {
		return true, ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rotate(now)
	var fresh int64
	for i, h := range hashes {
		if has(g.cur, h) || has(g.prev, h) || duplicate(hashes[:i], h) {
			continue
		}
		fresh++
	}
	if fresh > 0 {
		who = caller()
		st, found := g.callers.Get(who)
		if !found {
			st = new(backend.State)
		}
		next, d := backend.Decide(*st, g.lim, now, fresh)
		if !d.Allowed {
			if !found {
				g.callers.Add(who, st)
			}
			return false, who
		}
		*st = next
		if !found {
			g.callers.Add(who, st)
		}
	}
	for _, h := range hashes {
		mark(g.cur, h)
	}
	return true, ""
}

func duplicate(earlier []uint64, h uint64) bool {
	for _, e := range earlier {
		if e == h {
			return true
		}
	}
	return false
}

// checkNewKeys applies the new-key gate to w's keys; nil when the request may go on.
func (s *Service) checkNewKeys(ctx context.Context, w *work) error {
	g := s.newKeys
	w.hashes = w.hashes[:0]
	for k := range w.items {
		w.hashes = append(w.hashes, g.hash(w.items[k].req.Key))
	}
	now := g.start.UnixMicro() + time.Since(g.start).Microseconds()
	ok, who := g.admit(w.hashes, func() string { return callerOf(ctx) }, now)
	if ok {
		return nil
	}
	if s.metrics != nil {
		s.metrics.newKeys.Inc()
	}
	err := newKeysError(who, g.max)
	s.warn.Warn("new keys refused", "request refused: its caller creates too many new keys", "caller", who, "max_new_keys_per_caller", g.max)
	return err
}

func newKeysError(who string, max int64) error {
	return status.Errorf(codes.ResourceExhausted, "caller %s created more than %d new keys a second (--max-new-keys-per-caller)", who, max)
}

// httpPeerKey carries the remote address of a POST /json request to the new-key gate.
type httpPeerKey struct{}

// callerOf names the caller of ctx for the new-key gate: the first name of its verified client
// certificate, as the caller policy reads them (policy.Identities), else its IP address (an IPv6
// address by its /64, which one host commonly holds whole); "unknown" without either.
func callerOf(ctx context.Context) string {
	var addr net.Addr
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.VerifiedChains) > 0 && len(info.State.VerifiedChains[0]) > 0 {
			if ids := policy.Identities(info.State.VerifiedChains[0][0]); len(ids) > 0 {
				return ids[0]
			}
		}
		addr = p.Addr
	}
	var ap netip.AddrPort
	switch a := addr.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case nil:
		s, _ := ctx.Value(httpPeerKey{}).(string)
		ap, _ = netip.ParseAddrPort(s)
	default:
		ap, _ = netip.ParseAddrPort(a.String())
	}
	ip := ap.Addr().Unmap()
	switch {
	case !ip.IsValid():
		return "unknown"
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
