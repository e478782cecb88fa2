package service

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// rawCodec sends and receives messages as bytes, so that a test can send what no protobuf
// library would encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// rawRequest encodes a RateLimitRequest by hand: domain, then one descriptor of one entry.
func rawRequest(domain, key, value string) []byte {
	var entry, d, req []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, key)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, value)
	d = protowire.AppendTag(d, 1, protowire.BytesType)
	d = protowire.AppendBytes(d, entry)
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendString(req, domain)
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	return protowire.AppendBytes(req, d)
}

// serve starts a gRPC server for svc on a loopback TCP port with opts and returns a client
// connection to it and the count of calls its interceptor saw (as metrics interceptors do).
func serve(t *testing.T, svc *Service, opts ...grpc.ServerOption) (*grpc.ClientConn, *atomic.Int64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int64
	opts = append(opts, grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen.Add(1)
		return h(ctx, req)
	}))
	srv := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, &seen
}

const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func TestInvalidUTF8OverGRPC(t *testing.T) {
	f := newFixture(t, Options{})
	withCodec, seenWith := serve(t, f.svc, grpc.ForceServerCodecV2(Codec()))
	without, seenWithout := serve(t, f.svc)
	tests := []struct {
		name  string
		req   []byte
		field string
	}{
		{"domain", rawRequest("api\xff", "key", "k"), "domain is not valid UTF-8"},
		{"key", rawRequest("api", "ke\xc3y", "k"), "descriptors[0].entries[0]: key is not valid UTF-8"},
		{"value", rawRequest("api", "key", "\xed\xa0\x80"), "descriptors[0].entries[0]: value is not valid UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var resp []byte
			before := seenWith.Load()
			err := withCodec.Invoke(ctx, method, &tc.req, &resp, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("with service.Codec: %v, want InvalidArgument: %s", err, tc.field)
			}
			if seenWith.Load() != before+1 {
				t.Fatalf("the call did not reach the interceptors")
			}
			// grpc-go's own codec refuses it before any interceptor: INTERNAL, unseen.
			err = without.Invoke(ctx, method, &tc.req, &resp, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.Internal || seenWithout.Load() != 0 {
				t.Fatalf("with grpc-go's codec: %v (seen %d), want Internal, unseen", err, seenWithout.Load())
			}
		})
	}
	// A valid request and its response are unchanged by the codec.
	ctx := context.Background()
	req := rawRequest("api", "key", "ünïcode")
	var raw []byte
	if err := withCodec.Invoke(ctx, method, &req, &raw, grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatal(err)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(raw, &resp); err != nil || codesOf(&resp) != "OK OK" || resp.Statuses[0].GetCurrentLimit().GetName() != "per_key" {
		t.Fatalf("valid request: %v %v", &resp, err)
	}
}

func TestUnmarshalRequestMatchesProto(t *testing.T) {
	for i, r := range seedRequests() {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		// Unknown fields of every wire type, a repeated singular message (merged) and a
		// repeated scalar (last wins).
		b = protowire.AppendTag(b, 99, protowire.VarintType)
		b = protowire.AppendVarint(b, 7)
		b = protowire.AppendTag(b, 98, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, 7)
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, 1<<33+5)
		b = protowire.AppendTag(b, 1, protowire.VarintType) // domain with the wrong wire type: unknown
		b = protowire.AppendVarint(b, 1)
		var want, got rlsv3.RateLimitRequest
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if err := UnmarshalRequest(b, &got); err != nil || !proto.Equal(&want, &got) {
			t.Fatalf("seed %d: %v %v\nwant %v", i, &got, err, &want)
		}
	}
	for _, bad := range [][]byte{{0x0a}, {0x0a, 0x05, 'a'}, {0x00}, {0x0c}, {0x0b}, {0xff}} {
		var m rlsv3.RateLimitRequest
		if err := UnmarshalRequest(bad, &m); err == nil {
			t.Errorf("%x: decoded %v, want an error", bad, &m)
		}
		if err := proto.Unmarshal(bad, &m); err == nil {
			t.Errorf("%x: proto.Unmarshal decodes it", bad)
		}
	}
}

// UnmarshalRequest decodes the fields below and keeps anything else as unknown: a field added
// to these messages by a go-control-plane upgrade must be added there too.
func TestUnmarshalRequestKnowsEveryField(t *testing.T) {
	decoded := map[protoreflect.FullName][]protoreflect.FieldNumber{
		"envoy.service.ratelimit.v3.RateLimitRequest":                                {1, 2, 3},
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor":                   {1, 2, 3, 4},
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry":             {1, 2},
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride": {1, 2, 3},
		"google.protobuf.UInt64Value":                                                {1},
		"google.protobuf.UInt32Value":                                                {1},
	}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		want, ok := decoded[md.FullName()]
		if !ok {
			t.Errorf("%s is not decoded by UnmarshalRequest", md.FullName())
			return
		}
		var got []protoreflect.FieldNumber
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			got = append(got, f.Number())
			if f.Message() != nil {
				walk(f.Message())
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s has fields %v; UnmarshalRequest decodes %v", md.FullName(), got, want)
		}
	}
	walk((&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor())
}
