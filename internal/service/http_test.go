package service

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestJSONContentType(t *testing.T) {
	f := newFixture(t, Options{})
	h := f.svc.JSONHandler()
	// per_key admits 3 a minute: the refused requests come first and must not spend them.
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"key","value":"x"}]}]}`
	tests := []struct {
		contentType string
		code        int
	}{
		{"", http.StatusUnsupportedMediaType},
		{"text/plain", http.StatusUnsupportedMediaType},
		{"application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"multipart/form-data; boundary=x", http.StatusUnsupportedMediaType},
		{"application/json;;", http.StatusUnsupportedMediaType},
		{"application/json", 200},
		{"application/json; charset=utf-8", 200},
		{"Application/JSON", 200},
	}
	for _, tc := range tests {
		t.Run(tc.contentType, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tc.code)
			}
			if tc.code == http.StatusUnsupportedMediaType && !strings.Contains(rec.Body.String(), "Content-Type must be application/json") {
				t.Fatalf("body %q does not say why", rec.Body)
			}
		})
	}
}

// TestJSONTooLarge: a body over the bound is answered 413, at once when its Content-Length says
// so, and when it is found reading (chunked, no length).
func TestJSONTooLarge(t *testing.T) {
	f := newFixture(t, Options{})
	h := f.svc.JSONHandler()
	big := `{"domain":"api","descriptors":[{"entries":[{"key":"key","value":"` + strings.Repeat("x", DefaultMaxRequestBytes) + `"}]}]}`
	for _, declared := range []bool{true, false} {
		req := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(big))
		req.Header.Set("Content-Type", "application/json")
		if !declared {
			req.ContentLength = -1 // unknown, as with chunked encoding
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "over") {
			t.Errorf("declared length %v: %d %q, want 413 saying the body is too large", declared, rec.Code, rec.Body)
		}
	}
}
