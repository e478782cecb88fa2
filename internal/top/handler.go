package top

import (
	_ "embed"
	"net/http"
	"strconv"

	"github.com/rls-project/rls/internal/httpjson"
)

// ParseQuery reads a query from /debug/top's parameters: domain, rule, window (1m or 10m),
// sort (denials or hits) and keys (per rule, 10 by default).
func ParseQuery(get func(string) string) (Query, string) {
	q := Query{Domain: get("domain"), Rule: get("rule"), Window: Windows["1m"], Keys: 10}
	if w := get("window"); w != "" {
		d, ok := Windows[w]
		if !ok {
			return q, "window: want 1m or 10m"
		}
		q.Window = d
	}
	switch get("sort") {
	case "", "denials":
	case "hits":
		q.ByHits = true
	default:
		return q, "sort: want denials or hits"
	}
	if k := get("keys"); k != "" {
		n, err := strconv.Atoi(k)
		if err != nil || n < 1 {
			return q, "keys: want a number ≥ 1"
		}
		q.Keys = n
	}
	return q, ""
}

// Handler serves GET /debug/top: the report the query parameters ask for (ParseQuery), as JSON.
// With a nil Top it answers 404, saying how to turn the top talkers on.
func (t *Top) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t == nil {
			http.Error(w, "top talkers are off (--top-keys 0)", http.StatusNotFound)
			return
		}
		q, bad := ParseQuery(r.URL.Query().Get)
		if bad != "" {
			http.Error(w, bad, http.StatusBadRequest)
			return
		}
		httpjson.Write(w, http.StatusOK, t.Report(q))
	})
}

//go:embed page.html
var page []byte

// PageHandler serves GET /debug/top.html: a page that shows /debug/top and refreshes itself
// every two seconds. It loads nothing but /debug/top: no scripts, styles or fonts from
// elsewhere, so that it works where nothing outside can be reached.
func PageHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
		h.Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(page)
	})
}
