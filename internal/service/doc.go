// Package service answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit: it
// validates the request, matches each descriptor to a rule (package descriptors), decides all of
// them in one all-or-nothing backend call (package backend) and builds the response. It is the
// only package besides cmd that knows Envoy's protos, and the one place that maps errors to gRPC
// codes.
package service
