package redis

import (
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		name, url, want string
		user, pass      string
		err             string
	}{
		{name: "single", url: "redis://127.0.0.1:6379", want: "single 127.0.0.1:6379"},
		{name: "single db and auth", url: "redis://u:p%40ss@h:1/2", want: "single h:1 db 2", user: "u", pass: "p@ss"},
		{name: "single tls", url: "rediss://h:6380", want: "single h:6380 tls"},
		{name: "sentinel", url: "redis-sentinel://u:p@s1:26379,s2/mymaster?db=3&sentinel_password=sp", want: "sentinel s1:26379,s2:26379 master mymaster db 3", user: "u", pass: "p"},
		{name: "sentinel db in path", url: "rediss-sentinel://s1/m/4", want: "sentinel s1:26379 master m db 4 tls"},
		{name: "cluster", url: "redis-cluster://a:7000,b:7001,c", want: "cluster a:7000,b:7001,c:6379"},
		{name: "cluster tls auth", url: "rediss-cluster://:secret@a:7000", want: "cluster a:7000 tls", pass: "secret"},
		{name: "no scheme", url: "localhost:6379", err: "no scheme"},
		{name: "unknown scheme", url: "memcached://h", err: `scheme "memcached"`},
		{name: "sentinel without master", url: "redis-sentinel://s1:26379", err: "master name"},
		{name: "cluster with db", url: "redis-cluster://a:7000/1", err: "no databases"},
		{name: "unknown parameter", url: "redis-cluster://a:7000?pool=3", err: `unknown parameter "pool"`},
		{name: "password hidden in errors", url: "redis-cluster://u:hunter2@a:7000/1", err: "u:xxx@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseURL(tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("ParseURL(%q) error %v, want one containing %q and no password", tc.url, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want || got.Username != tc.user || got.Password != tc.pass {
				t.Fatalf("ParseURL(%q) = %q user %q pass %q, want %q user %q pass %q", tc.url, got, got.Username, got.Password, tc.want, tc.user, tc.pass)
			}
			if strings.Contains(got.String(), "p@ss") || (tc.pass != "" && strings.Contains(got.String(), tc.pass)) {
				t.Fatalf("String() %q shows the password", got)
			}
		})
	}
}

// TestParseURLRefusesAddresses: an address that can never be dialed is refused at parse time,
// naming it and why, where it used to be accepted and the breaker then stayed open for ever.
func TestParseURLRefusesAddresses(t *testing.T) {
	for _, tc := range []struct{ url, err string }{
		{"redis://127.0.0.1:99999", `port "99999": want a number from 1 to 65535`},
		{"redis://127.0.0.1:0", `port "0"`},
		{"redis://127.0.0.1:abc", `invalid port ":abc"`},
		{"redis://:6379", "no host"},
		{"redis://", "no host"},
		{"rediss://u:hunter2@:6380", "no host"},
		{"redis-cluster://a:7000,b:99999", `address "b:99999": port "99999"`},
		{"redis-cluster://a:7000,:7001", `address ":7001": no host`},
		{"redis-cluster://a:x", `address "a:x": port "x"`},
		{"redis-sentinel://s1:26379,s2:65536/m", `address "s2:65536"`},
		{"redis-sentinel://::1/m", `address "::1": want host:port`},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := ParseURL(tc.url)
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "redis url") {
				t.Fatalf("ParseURL(%q): %v, want an error containing %q", tc.url, err, tc.err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
	for _, ok := range []string{"redis://[::1]:6379", "redis://h", "redis-cluster://[::1]:7000,h:65535", "unix:///run/redis.sock", "redis-sentinel://s1/m"} {
		if _, err := ParseURL(ok); err != nil {
			t.Errorf("ParseURL(%q): %v", ok, err)
		}
	}
}

// TestParseURLHidesPasswords: no error of any URL form, valid or not, shows a password or any
// part of one, nor RedactURL's display of it.
func TestParseURLHidesPasswords(t *testing.T) {
	const pw = "Hunter2pw" // found whole; each case also checks its own fragments
	for _, tc := range []struct {
		url    string
		secret []string // what must not appear, besides pw
	}{
		{"redis://u:" + pw + "@h:99999", nil},
		{"redis://u:" + pw + "@h:abc", nil},
		{"rediss://:" + pw + "@h:1/x", nil},
		{"redis://" + pw + "@h:1?bad_option=1", nil},
		{"redis://u:" + pw + "%zz@h:1", []string{"%zz"}},
		{"redis://u:pa#" + pw + "@h:1", []string{"pa#"}},
		{"redis://u:pa?" + pw + "@h:1", []string{"pa?"}},
		{"redis://u:p a" + pw + "@h:1", []string{"p a"}},
		{"unix://u:" + pw + "@/run/r.sock?db=x", nil},
		{"unix://u:" + pw + "@", nil},
		{"redis-sentinel://u:" + pw + "@s1:26379/m?sentinel_password=" + pw + "&x=1", nil},
		{"redis-sentinel://s1:26379/m?sentinel_password=" + pw + "%zz", []string{"%zz"}},
		{"redis-sentinel://s1:26379?sentinel_password=" + pw, nil},
		{"redis-sentinel://s1:99999/m?sentinel_password=a@" + pw, nil},
		{"redis-sentinel://u:" + pw + "%zz@s1:26379/m", []string{"%zz"}},
		{"redis-cluster://u:" + pw + "@a:7000/1", nil},
		{"redis-cluster://u:p%" + pw + "@a:7000", []string{"p%"}},
		{"rediss-cluster://:" + pw + "@a:x", nil},
		{"u:" + pw + "@h:6379", nil},
		{"memcached://u:" + pw + "@h", nil},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := ParseURL(tc.url)
			if err == nil {
				t.Fatalf("ParseURL(%q) accepted it", tc.url)
			}
			for _, s := range append([]string{pw, strings.ToLower(pw)}, tc.secret...) {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error shows %q: %v", s, err)
				}
				if shown := RedactURL(tc.url); strings.Contains(shown, s) {
					t.Errorf("RedactURL shows %q: %s", s, shown)
				}
			}
		})
	}
}
