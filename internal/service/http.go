package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rls-project/rls/internal/limit"
)

// JSONHandler serves POST /json: a RateLimitRequest in protojson in, the RateLimitResponse in
// protojson out, with status 200 when OK, 429 when over the limit, 400 for a bad request, 403 when
// the caller policy refuses it, 429 with the reason when its caller created more than
// --max-new-keys-per-caller new keys a second, and 503 when the backend is unavailable.
func (s *Service) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("panic serving /json", "panic", p)
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		req, ok := readRequest(w, r, s.maxJSON)
		if !ok {
			return
		}
		ctx := r.Context()
		if s.newKeys != nil || s.decisions != nil {
			ctx = context.WithValue(ctx, httpPeerKey{}, r.RemoteAddr)
		}
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			code := http.StatusInternalServerError
			switch status.Code(err) {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.PermissionDenied:
				code = http.StatusForbidden
			case codes.ResourceExhausted:
				code = http.StatusTooManyRequests
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
//
// A body is at most maxBody bytes (413 past that), and its shape is checked against the bounds on
// a request (MaxDescriptors, MaxEntries, nesting) as it is scanned, before any of it is built.
func readRequest(w http.ResponseWriter, r *http.Request, maxBody int64) (*rlsv3.RateLimitRequest, bool) {
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
	tooLarge := fmt.Sprintf("the body is over %d bytes", maxBody)
	if r.ContentLength > maxBody {
		// Said up front: answered before reading any of it.
		http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
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
	if err := scanJSON(body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, false
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return &req, true
}

// maxJSONDepth bounds the nesting of a /json body: a RateLimitRequest nests five deep (request,
// descriptors, descriptor, entries, entry).
const maxJSONDepth = 8

// scanJSON walks a /json body's tokens, without building anything of it, and refuses one with
// more descriptors or entries than a request may carry (with the reason validation gives) or
// nested deeper than a RateLimitRequest can be. protojson builds a whole body before validation
// could count it, so without this a 1 MiB body of empty descriptors would take tens of MB.
// Bodies that are not JSON pass: protojson says what is wrong with them.
func scanJSON(body []byte) error {
	sc := jsonScan{dec: json.NewDecoder(bytes.NewReader(body))}
	sc.dec.UseNumber()
	err := sc.value(jsonRequest, 0, 0)
	var be *boundError
	if errors.As(err, &be) {
		return be
	}
	return nil
}

type jsonScan struct{ dec *json.Decoder }

// What a JSON value is in a RateLimitRequest, as far as its bounds go.
const (
	jsonOther = iota
	jsonRequest
	jsonDescriptors
	jsonDescriptor
	jsonEntries
)

// value scans one value of kind at depth; i is its descriptor's index.
func (sc *jsonScan) value(kind, depth, i int) error {
	if depth > maxJSONDepth {
		return &boundError{fmt.Sprintf("JSON nested deeper than %d", maxJSONDepth)}
	}
	tok, err := sc.dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		for sc.dec.More() {
			k, err := sc.dec.Token()
			if err != nil {
				return err
			}
			child := jsonOther
			switch {
			case kind == jsonRequest && k == "descriptors":
				child = jsonDescriptors
			case kind == jsonDescriptor && k == "entries":
				child = jsonEntries
			}
			if err := sc.value(child, depth+1, i); err != nil {
				return err
			}
		}
	case json.Delim('['):
		n := 0
		for sc.dec.More() {
			child := jsonOther
			if kind == jsonDescriptors && n < limit.MaxDescriptors {
				child = jsonDescriptor
			}
			if err := sc.value(child, depth+1, n); err != nil {
				return err
			}
			n++
		}
		switch {
		case kind == jsonDescriptors && n > limit.MaxDescriptors:
			return &boundError{tooManyDescriptors(n)}
		case kind == jsonEntries && n > limit.MaxEntries:
			return &boundError{tooManyEntries(i, n)}
		}
	default:
		return nil
	}
	_, err = sc.dec.Token() // the closing delimiter
	return err
}
