// Package client asks rls, over gRPC, whether a request is within its rate limits. It is the
// direct caller's counterpart of Envoy's rate-limit filter: one reused connection, a per-call
// deadline well under the caller's own, no retries, and a failure policy (allow, deny or error)
// for when rls cannot answer in time. An optional local tier admits bursts in this process, with
// rls's own GCRA, before asking rls.
//
// Packages httplimit and grpclimit build on it: net/http middleware and gRPC server
// interceptors that turn a Decision into a 429 or RESOURCE_EXHAUSTED with the right headers.
// They ask a Checker, which *Client is; in a handler's tests a CheckerFunc plays rls, with
// NewDecision for its answers and FailurePolicy.Answer for its outages.
//
//	c, err := client.New("rls:8081", client.Options{Domain: "shop"})
//	...
//	d, err := c.Check(ctx, client.Desc("api_key", key), client.Desc("generic_key", "global"))
//	if err != nil { ... } // only with FailError, a cancelled ctx or invalid descriptors
//	if !d.Allowed {
//		// d.Descriptor is the limiting descriptor, d.Limit its limit, d.RetryAfter the wait.
//	}
package client
