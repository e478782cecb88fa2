package service

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a POST /json body.
const maxJSONBody = 1 << 20

// JSONHandler serves POST /json: a RateLimitRequest in protojson in, the RateLimitResponse in
// protojson out, with status 200 when OK, 429 when over the limit, 400 for a bad request, 403 when
// the caller policy refuses it and 503 when the backend is unavailable.
func (s *Service) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("panic serving /json", "panic", p)
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		req, ok := readRequest(w, r)
		if !ok {
			return
		}
		resp, err := s.ShouldRateLimit(r.Context(), req)
		if err != nil {
			code := http.StatusInternalServerError
			switch status.Code(err) {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.PermissionDenied:
				code = http.StatusForbidden
			case codes.Unavailable:
				code = http.StatusServiceUnavailable
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
}

// readRequest reads a POSTed RateLimitRequest in protobuf JSON; when it cannot, it answers the
// client (405, 415 or 400, with the reason) and reports false.
//
// Only Content-Type application/json is accepted: a browser sends that cross-site only after a
// CORS preflight, which rls never answers, so a page elsewhere cannot spend a user's budget with
// a form or a simple fetch (text/plain, form encodings).
func readRequest(w http.ResponseWriter, r *http.Request) (*rlsv3.RateLimitRequest, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST with a JSON RateLimitRequest", http.StatusMethodNotAllowed)
		return nil, false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		w.Header().Set("Accept-Post", "application/json")
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return nil, false
	}
	tooLarge := fmt.Sprintf("the body is over %d bytes", maxJSONBody)
	if r.ContentLength > maxJSONBody {
		// Said up front: answered before reading any of it.
		http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		} else {
			// The error's own text can name sockets: the client needs only what went wrong.
			http.Error(w, "reading body: incomplete or timed out", http.StatusBadRequest)
		}
		return nil, false
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return &req, true
}
