//go:build vtprotobuf

package service

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// With -tags vtprotobuf, Codec encodes responses with vtprotobuf: the same message as proto.
func TestCodecMarshalVT(t *testing.T) {
	withMeta := benchResponse()
	withMeta.DynamicMetadata, _ = structpb.NewStruct(map[string]any{"quotaModeEnabled": true, "quotaModeViolations": []any{1.0}, "backend": "primary"})
	withMeta.ResponseHeadersToAdd = nil
	for _, resp := range []*rlsv3.RateLimitResponse{benchResponse(), withMeta, {}} {
		out, err := Codec().Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var got rlsv3.RateLimitResponse
		if err := proto.Unmarshal(out.Materialize(), &got); err != nil || !proto.Equal(&got, resp) {
			t.Fatalf("vtprotobuf encodes %v (%v), want %v", &got, err, resp)
		}
		out.Free()
	}
}
