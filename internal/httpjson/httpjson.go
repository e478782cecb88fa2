// Package httpjson writes the JSON answers of rls's HTTP endpoints (the debug pages, /v1/keys,
// RLQS's observation endpoints), indented for people reading them with curl.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Write answers with status code and v as indented JSON.
func Write(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
