package redis

import (
	"crypto/sha256"
	"encoding/hex"
	"github.com/rls-project/rls/internal/pipeline"
	"strings"
)

// Where a request goes: its key's name in Redis (storedKey) and, on a Cluster, its slot; then
// the seam between a single node and a Cluster: route puts a decision's calls into groups, one
// per node they go to, and rerouted follows the redirects of a Cluster whose slots moved. On a
// single node (and Sentinel) there is one group, the single node's; on a Cluster, one per master
// that the slot map (topology.go) says owns a call's slot.

// maxRawKey is the longest key stored as it is; longer keys are stored by their SHA-256.
const maxRawKey = 200

const hashedMark = "sha256:"

// storedKey is the Redis key name of key under prefix. The mapping is injective: a long key (or
// one that looks hashed) becomes "sha256:" and its hash; a key holding '{' gets a leading "{}",
// the empty hash tag, so that Redis Cluster hashes the whole name and a value sent by a client
// cannot pin keys to one slot; any other key is kept as it is.
func storedKey(prefix, key string) string {
	switch {
	case len(key) > maxRawKey || strings.HasPrefix(key, hashedMark):
		sum := sha256.Sum256([]byte(key))
		return prefix + hashedMark + hex.EncodeToString(sum[:])
	case strings.IndexByte(key, '{') >= 0:
		return prefix + "{}" + key
	}
	return prefix + key
}

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key, or of its hash tag
// (the text between the first '{' and the next '}', when not empty), modulo 16384.
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % slotCount)
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// route groups j's calls by the node they go to.
func (b *core) route(j *job) error {
	j.groups = j.groups[:0]
	if !b.cluster {
		for k := range j.calls {
			j.addToGroup(b.single, &j.calls[k])
		}
		return nil
	}
	t := b.topo.Load()
	if t == nil {
		b.topo.requestReload(reasonNoMap)
		return errNoSlotMap
	}
	for k := range j.calls {
		n := t.owner[j.slots[k]]
		if n == nil {
			b.topo.requestReload(reasonNodeDown)
			return errUnowned
		}
		j.calls[k].node = n
		j.addToGroup(n, &j.calls[k])
	}
	return nil
}

// rerouted regroups the calls of j that found their slot moved (MOVED or ASK: they ran nothing)
// to the nodes their replies name, and asks for the slot map again. It reports whether there
// were any. Off a Cluster there are no slots to follow: a redirect is an error like any other.
func (b *core) rerouted(j *job) bool {
	if !b.cluster {
		return false
	}
	any := false
	for k := range j.calls {
		c := &j.calls[k]
		if c.err == nil {
			continue // and spares redirect's two allocations (go-redis's HasErrorPrefix) a call
		}
		addr, ask, ok := redirect(c.err)
		if !ok {
			continue
		}
		if !any {
			j.groups = j.groups[:0]
			any = true
		}
		if ask {
			b.topo.requestReload(reasonAsk)
		} else {
			b.topo.requestReload(reasonMoved)
		}
		c.err, c.asking, c.node = nil, ask, b.topo.nodeFor(addr)
		j.addToGroup(c.node, c)
	}
	return any
}

// addToGroup adds c to the group of n, starting one with a pooled pending.
func (j *job) addToGroup(n *node, c *call) {
	g := 0
	for g < len(j.groups) && j.groups[g].n != n {
		g++
	}
	if g == len(j.groups) {
		if len(j.pend) == g {
			j.pend = append(j.pend, pipeline.NewPending[*call]())
		}
		p := j.pend[g]
		p.Calls, p.Multi = p.Calls[:0], c.multi
		j.groups = append(j.groups, group{n: n, p: p})
	}
	j.groups[g].p.Calls = append(j.groups[g].p.Calls, c)
}
