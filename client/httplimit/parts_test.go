package httplimit

import (
	"net/http"
	"strings"
	"testing"
)

func TestClientIP(t *testing.T) {
	trusted, err := TrustProxies("10.0.0.0/8", "192.0.2.1", "2001:db8::/32")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		peer   string
		xff    []string
		want   string
		wantOK bool
	}{
		{"untrusted peer, no header", "203.0.113.5:1234", nil, "203.0.113.5", true},
		{"untrusted peer ignores header", "203.0.113.5:1234", []string{"1.1.1.1"}, "203.0.113.5", true},
		{"trusted peer, no header", "10.0.0.1:80", nil, "10.0.0.1", true},
		{"trusted peer, one hop", "10.0.0.1:80", []string{"198.51.100.1"}, "198.51.100.1", true},
		{"rightmost untrusted wins", "10.0.0.1:80", []string{"6.6.6.6, 198.51.100.1, 10.2.2.2"}, "198.51.100.1", true},
		{"several header lines", "10.0.0.1:80", []string{"6.6.6.6", "198.51.100.1, 192.0.2.1"}, "198.51.100.1", true},
		{"all trusted: leftmost", "10.0.0.1:80", []string{"10.3.3.3, 10.2.2.2"}, "10.3.3.3", true},
		{"garbage hop stops the walk", "10.0.0.1:80", []string{"6.6.6.6, garbage, 10.2.2.2"}, "10.2.2.2", true},
		{"hop with port", "10.0.0.1:80", []string{"198.51.100.1:4444"}, "198.51.100.1", true},
		{"ipv6 hop", "10.0.0.1:80", []string{"[2001:db9::1]:443"}, "2001:db9::1", true},
		{"ipv6 trusted peer", "[2001:db8::5]:80", []string{"2001:db9::2"}, "2001:db9::2", true},
		{"v4-mapped peer", "[::ffff:203.0.113.5]:1", nil, "203.0.113.5", true},
		{"non-IP peer", "@", nil, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			e, ok := ClientIP(trusted)(r)
			if ok != tc.wantOK || e.Value != tc.want || (ok && e.Key != "remote_address") {
				t.Errorf("got %+v %v, want %q %v", e, ok, tc.want, tc.wantOK)
			}
		})
	}
	if _, err := TrustProxies("10.0.0.0/33"); err == nil {
		t.Error("bad prefix accepted")
	}
	if _, err := TrustProxies("host"); err == nil {
		t.Error("bad address accepted")
	}
}

func TestParts(t *testing.T) {
	pp, err := PathPattern("/users/{id}", "POST /login")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := PathPattern("/a/{x}", "/{y}/b"); err == nil {
		t.Error("conflicting patterns accepted")
	}
	long := strings.Repeat("x", 5000)
	r, _ := http.NewRequest("POST", "http://h/users/42", nil)
	r.Header.Set("X-Key", "bad\xffvalue")
	r.Header.Set("X-Long", long)
	cases := []struct {
		name string
		part Part
		want string
		ok   bool
	}{
		{"pattern", pp, "path=/users/{id}", true},
		{"method", Method(), "method=POST", true},
		{"path", Path(), "path=/users/42", true},
		{"invalid utf-8 replaced", Header("x-key", "k"), "k=bad\uFFFDvalue", true},
		{"long value cut", Header("X-Long", "k"), "k=" + long[:4096], true},
		{"absent header", Header("X-None", "k"), "", false},
		{"no route outside a mux", Route(), "", false},
		{"generic", Generic("g"), "generic_key=g", true},
	}
	for _, tc := range cases {
		e, ok := tc.part(r)
		if ok != tc.ok || (ok && e.Key+"="+e.Value != tc.want) {
			t.Errorf("%s: %+v %v, want %q %v", tc.name, e, ok, tc.want, tc.ok)
		}
	}
	r2, _ := http.NewRequest("GET", "http://h/other", nil)
	if _, ok := pp(r2); ok {
		t.Error("pattern matched /other")
	}
}
