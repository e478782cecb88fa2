package service

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/rls-project/rls/internal/descriptors"
)

// UnknownDomainHeader is the gRPC response header, outside the RateLimitResponse Envoy reads,
// with which rls says that a request named a domain none of its rules define (its value is
// "true"): the answer stays OK, as Envoy sees it, and rls check tells whoever asked.
const UnknownDomainHeader = "rls-unknown-domain"

var unknownDomain = metadata.Pairs(UnknownDomainHeader, "true")

// markUnknownDomain sets UnknownDomainHeader on a gRPC call whose domain rs does not define; on
// anything but a gRPC call (POST /json) it does nothing.
func markUnknownDomain(ctx context.Context, rs *descriptors.RuleSet, domain string) {
	if !rs.HasDomain(domain) && grpc.ServerTransportStreamFromContext(ctx) != nil {
		_ = grpc.SetHeader(ctx, unknownDomain)
	}
}
