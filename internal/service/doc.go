// Package service answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit: it
// validates the request, matches each descriptor to a rule (package descriptors), decides all of
// them in one all-or-nothing backend call (package backend) and builds the response. It is the
// one place that maps ShouldRateLimit's errors to gRPC codes and applies the failure policy. Envoy's
// protos (go-control-plane) are known here and, beside cmd/rls, to internal/policy (caller
// policies read the request), internal/rlqs (the Rate Limit Quota Service), internal/xds and
// internal/xdstest (rules over xDS), the client and the deploy and integration tests; the
// descriptor tree and the backends know none of them.
//
// A request becomes one item per limit of each descriptor (translate); the backend decides the
// items, or, when it is unavailable, failurePolicy answers every item by its failure mode. Errors
// reach clients as a short kind, never with their text. Codec is the gRPC codec the server must
// be built with so that invalid UTF-8 is answered INVALID_ARGUMENT rather than INTERNAL.
package service
