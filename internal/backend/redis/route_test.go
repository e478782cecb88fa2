package redis

import (
	"context"
	"strings"
	"testing"
)

func TestStoredKey(t *testing.T) {
	long := strings.Repeat("v", maxRawKey+1)
	for _, tc := range []struct{ name, key, want string }{
		{"plain", "7:example6:api_key3:abc#0", "rls:7:example6:api_key3:abc#0"},
		{"hash tag neutralised", "3:a{b}", "rls:{}3:a{b}"},
		{"long", long, "rls:sha256:"},
		{"looks hashed", "sha256:x", "rls:sha256:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := storedKey("rls:", tc.key)
			if !strings.HasPrefix(got, tc.want) || (!strings.HasSuffix(tc.want, ":") && got != tc.want) {
				t.Fatalf("storedKey(%q) = %q, want %q", tc.key, got, tc.want)
			}
			if len(got) > len("rls:")+maxRawKey+2 {
				t.Fatalf("storedKey(%q) is %d bytes long", tc.key, len(got))
			}
		})
	}
	if storedKey("", long) == storedKey("", long+"x") || storedKey("", "sha256:x") == storedKey("", "sha256:y") {
		t.Fatal("distinct long keys stored alike")
	}
}

func TestSlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3 % slotCount},
		{"foo", 12182},
		{"bar", 5061},
	} {
		if got := slot(tc.key); got != tc.want {
			t.Errorf("slot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
	b := newTestBackend(t, clusterEnv, Options{})
	for _, key := range []string{"foo", "{user1000}.following", "foo{}{bar}", "{}3:a{b}", "rls:{}x{y}z", "a{b"} {
		want, err := b.rdb.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slot(key); got != int(want) {
			t.Errorf("slot(%q) = %d, Redis says %d", key, got, want)
		}
	}
}
