package service

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// RegisterServer registers s as the RateLimitService of g, as
// rlsv3.RegisterRateLimitServiceServer does, except that a request crossing a bound on its
// shape is found while it is decoded and answered INVALID_ARGUMENT with the reason validation
// gives, through g's interceptors: it is never built whole (see UnmarshalRequest). g must use
// Codec (grpc.ForceServerCodecV2(service.Codec())); with another codec requests are decoded
// whole and validated as before.
func RegisterServer(g grpc.ServiceRegistrar, s *Service) {
	g.RegisterService(&serviceDesc, s)
}

// serviceDesc is rlsv3's RateLimitService description with ShouldRateLimit's handler replaced.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler:    shouldRateLimitHandler,
	}},
	Streams:  []grpc.StreamDesc{},
	Metadata: rlsv3.RateLimitService_ServiceDesc.Metadata,
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := boundedRequest{req: new(rlsv3.RateLimitRequest)}
	if err := dec(&in); err != nil {
		return nil, err
	}
	handler := func(ctx context.Context, req any) (any, error) {
		if in.err != nil {
			return nil, in.err
		}
		return srv.(rlsv3.RateLimitServiceServer).ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	}
	if interceptor == nil {
		return handler(ctx, in.req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, in.req, info, handler)
}
