package service

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// benchRequest is a typical request from Envoy: two descriptors, one of two entries.
func benchRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge_proxy", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address", "203.0.113.54"),
		desc("header_match", "api", "api_key", "k-7c1b9e0f3a"),
	}}
}

// benchResponse is the answer to benchRequest.
func benchResponse() *rlsv3.RateLimitResponse {
	st := func(name string, rem uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, UnitMultiplier: wrapperspb.UInt32(1)},
			LimitRemaining:     rem,
			DurationUntilReset: durationpb.New(250 * time.Millisecond)}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st("per_ip", 97), st("per_key", 12)}}
}

// BenchmarkCodec compares grpc-go's protobuf codec with Codec on the server's side of a call:
// decoding a request, encoding a response (with -tags vtprotobuf, Codec encodes with
// go-control-plane's vtprotobuf code).
func BenchmarkCodec(b *testing.B) {
	raw, err := proto.Marshal(benchRequest())
	if err != nil {
		b.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(raw)}
	codecs := []struct {
		name string
		c    encoding.CodecV2
	}{{"proto", encoding.GetCodecV2(grpcproto.Name)}, {"rls", Codec()}}
	for _, c := range codecs {
		b.Run("unmarshal/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var m rlsv3.RateLimitRequest
				if err := c.c.Unmarshal(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	resp := benchResponse()
	for _, c := range codecs {
		b.Run("marshal/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				out, err := c.c.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}
