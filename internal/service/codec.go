package service

import (
	"errors"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/limit"
)

// Codec returns the gRPC codec for rls's server: grpc-go's protobuf codec, except that a
// RateLimitRequest is decoded by UnmarshalRequest, which leaves string fields unchecked for
// UTF-8. protobuf-go refuses invalid UTF-8 in proto3 strings while decoding, and grpc-go answers
// any codec error INTERNAL before interceptors (and so metrics) see the call; with this codec such
// a request reaches ShouldRateLimit, which answers INVALID_ARGUMENT naming the field. Install it
// per server with grpc.ForceServerCodecV2(service.Codec()); it is not registered globally.
func Codec() encoding.CodecV2 { return codec{base: encoding.GetCodecV2(grpcproto.Name)} }

// CodecMax is Codec, except that a RateLimitRequest of more than maxRequest bytes is refused
// (RESOURCE_EXHAUSTED, through RegisterServer's handler) before it is decoded: for a server
// whose gRPC bound on messages (grpc.MaxRecvMsgSize) is set higher for another service's sake.
func CodecMax(maxRequest int) encoding.CodecV2 {
	return codec{base: encoding.GetCodecV2(grpcproto.Name), maxRequest: maxRequest}
}

type codec struct {
	base       encoding.CodecV2
	maxRequest int // 0: no bound
}

// Marshal encodes with go-control-plane's vtprotobuf code when the binary is built with
// -tags vtprotobuf (about 3× faster on a typical response), else with grpc-go's codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(interface{ MarshalVTStrict() ([]byte, error) }); ok {
		b, err := m.MarshalVTStrict()
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.base.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	var m *rlsv3.RateLimitRequest
	var bounded *boundedRequest
	switch v := v.(type) {
	case *rlsv3.RateLimitRequest:
		m = v
	case *boundedRequest:
		bounded, m = v, v.req
	default:
		return c.base.Unmarshal(data, v)
	}
	if n := data.Len(); bounded != nil && c.maxRequest > 0 && n > c.maxRequest {
		bounded.err = status.Errorf(codes.ResourceExhausted, "a request of %d bytes: at most %d (--max-request-bytes)", n, c.maxRequest)
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	err := UnmarshalRequest(buf.ReadOnlyData(), m)
	if be, ok := err.(*boundError); ok && bounded != nil {
		bounded.err = status.Error(codes.InvalidArgument, be.reason)
		return nil
	}
	return err
}

// boundedRequest is what the ShouldRateLimit handler of RegisterServer decodes into: a request
// crossing one of the bounds on a request is not decoded further, and err is the
// INVALID_ARGUMENT it is answered (a codec error would reach the client as INTERNAL).
type boundedRequest struct {
	req *rlsv3.RateLimitRequest
	err error
}

// boundError is a request found, while decoding, to cross one of the bounds on a request; its
// reason is the text validation gives for it.
type boundError struct{ reason string }

func (e *boundError) Error() string { return e.reason }

func (codec) Name() string { return grpcproto.Name }

// errDecode is what UnmarshalRequest reports for bytes that are not a protobuf message.
var errDecode = errors.New("cannot parse invalid wire-format data")

// UnmarshalRequest decodes b into m (reset first) as proto.Unmarshal does — the same fields,
// merges, last-one-wins scalars and unknown fields kept — except that string fields are not
// checked for UTF-8: validate does that, so that the answer is INVALID_ARGUMENT. Strings are
// copied, never aliasing b.
//
// A request crossing a bound on its shape (MaxDescriptors, MaxEntries, MaxKeyBytes,
// MaxValueBytes) is not decoded further: the error, a *boundError, gives the reason validate
// would. Counts are read off the wire before anything of theirs is built, so what a request can
// make rls allocate is bounded by those constants, not by the size of the message.
func UnmarshalRequest(b []byte, m *rlsv3.RateLimitRequest) error {
	proto.Reset(m)
	if n := countField(b, 2); n > limit.MaxDescriptors {
		return &boundError{tooManyDescriptors(n)}
	}
	// A string field over its bound is not copied; it is an error unless a later occurrence
	// of the field replaces it (the last one wins, as in protobuf).
	long := false
	err := decodeMessage(b, m, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			long = len(v) > limit.MaxValueBytes
			if long {
				m.Domain = ""
				return nil
			}
			m.Domain = string(v)
		case num == 2 && typ == protowire.BytesType:
			d := &ratelimitv3.RateLimitDescriptor{}
			if err := decodeDescriptor(v, d, len(m.Descriptors)); err != nil {
				return err
			}
			m.Descriptors = append(m.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			m.HitsAddend = uint32(x)
		default:
			return errUnknownField
		}
		return nil
	})
	if err == nil && long {
		return &boundError{domainTooLong}
	}
	return err
}

// countField counts the fields numbered num with the length-delimited wire type among the
// top-level fields of the message in b, without decoding them. Bytes that are not a message
// count as far as they parse: decoding them reports the error.
func countField(b []byte, num protowire.Number) int {
	n := 0
	for len(b) > 0 {
		fn, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return n
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(fn, typ, b)
		if l < 0 {
			return n
		}
		if fn == num && typ == protowire.BytesType {
			n++
		}
		b = b[l:]
	}
	return n
}

// decodeDescriptor decodes b, the request's descriptor number i, into m.
func decodeDescriptor(b []byte, m *ratelimitv3.RateLimitDescriptor, i int) error {
	if n := countField(b, 1); n > limit.MaxEntries {
		return &boundError{tooManyEntries(i, n)}
	}
	return decodeMessage(b, m, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := &ratelimitv3.RateLimitDescriptor_Entry{}
			if err := decodeEntry(v, e, i, len(m.Entries)); err != nil {
				return err
			}
			m.Entries = append(m.Entries, e)
		case num == 2 && typ == protowire.BytesType:
			if m.Limit == nil {
				m.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}
			}
			return decodeOverride(v, m.Limit)
		case num == 3 && typ == protowire.BytesType:
			if m.HitsAddend == nil {
				m.HitsAddend = &wrapperspb.UInt64Value{}
			}
			return decodeMessage(v, m.HitsAddend, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				if num != 1 || typ != protowire.VarintType {
					return errUnknownField
				}
				m.HitsAddend.Value = x
				return nil
			})
		case num == 4 && typ == protowire.VarintType:
			m.IsNegativeHits = protowire.DecodeBool(x)
		default:
			return errUnknownField
		}
		return nil
	})
}

// decodeEntry decodes b, entry j of descriptor i, into m.
func decodeEntry(b []byte, m *ratelimitv3.RateLimitDescriptor_Entry, i, j int) error {
	longKey, longValue := false, false
	err := decodeMessage(b, m, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			if longKey = len(v) > limit.MaxKeyBytes; longKey {
				m.Key = ""
				return nil
			}
			m.Key = string(v)
		case num == 2 && typ == protowire.BytesType:
			if longValue = len(v) > limit.MaxValueBytes; longValue {
				m.Value = ""
				return nil
			}
			m.Value = string(v)
		default:
			return errUnknownField
		}
		return nil
	})
	switch {
	case err != nil:
		return err
	case longKey:
		return &boundError{keyTooLong(i, j)}
	case longValue:
		return &boundError{valueTooLong(i, j)}
	}
	return nil
}

func decodeOverride(b []byte, m *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	return decodeMessage(b, m, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			m.RequestsPerUnit = uint32(x)
		case num == 2 && typ == protowire.VarintType:
			m.Unit = typev3.RateLimitUnit(int32(x))
		case num == 3 && typ == protowire.BytesType:
			if m.UnitMultiplier == nil {
				m.UnitMultiplier = &wrapperspb.UInt32Value{}
			}
			return decodeMessage(v, m.UnitMultiplier, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				if num != 1 || typ != protowire.VarintType {
					return errUnknownField
				}
				m.UnitMultiplier.Value = uint32(x)
				return nil
			})
		default:
			return errUnknownField
		}
		return nil
	})
}

// errUnknownField is returned by a field function for a field (number and wire type) its
// message does not know: decodeMessage keeps it as an unknown field, as protobuf-go does.
var errUnknownField = errors.New("unknown field")

// decodeMessage walks the fields of the message encoded in b, calling field with each one's
// number, wire type and value (v for length-delimited fields, x for varints); unknown fields are
// appended to m's unknown fields with their tag re-encoded, as protobuf-go does.
func decodeMessage(b []byte, m proto.Message, field func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	var unknown []byte
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return errDecode
		}
		b = b[n:]
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		if tag>>3 < uint64(protowire.MinValidNumber) || tag>>3 > uint64(protowire.MaxValidNumber) || typ == protowire.EndGroupType {
			return errDecode
		}
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = 0
		}
		err := errUnknownField
		if n > 0 {
			err = field(num, typ, v, x)
		} else if n < 0 {
			return errDecode
		}
		if err == errUnknownField {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errDecode
			}
			unknown = protowire.AppendTag(unknown, num, typ)
			unknown = append(unknown, b[:n]...)
		} else if err != nil {
			return err
		}
		b = b[n:]
	}
	if unknown != nil {
		r := m.ProtoReflect()
		r.SetUnknown(append(r.GetUnknown(), unknown...))
	}
	return nil
}
