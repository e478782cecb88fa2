// Package service answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit: it
// validates the request, matches each descriptor to a rule (package descriptors), decides all of
// them in one all-or-nothing backend call (package backend) and builds the response. It is the
// only package besides cmd that knows Envoy's protos, and the one place that maps errors to gRPC
// codes and applies the failure policy.
//
// A request becomes one item per limit of each descriptor (translate); the backend decides the
// items, or, when it is unavailable, failurePolicy answers every item by its failure mode. Errors
// reach clients as a short kind, never with their text. Codec is the gRPC codec the server must
// be built with so that invalid UTF-8 is answered INVALID_ARGUMENT rather than INTERNAL.
package service
