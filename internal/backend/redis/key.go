package redis

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

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
