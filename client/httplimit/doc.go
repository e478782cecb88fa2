// Package httplimit is net/http middleware that rate-limits requests with rls. Descriptors are
// built from each request (client IP behind trusted proxies, a header such as an API key, the
// method, the path or the ServeMux route, a value from the request context), one or more per
// route; a denied request gets 429 with Retry-After and the rate-limit headers, and an allowed
// one carries the headers too.
//
//	c, _ := client.New("rls:8081", client.Options{Domain: "shop"})
//	lim := httplimit.New(c, httplimit.Options{})
//	proxies, _ := httplimit.TrustProxies("10.0.0.0/8")
//	mux.Handle("GET /search", lim.Handler(search,
//		httplimit.By(httplimit.ClientIP(proxies)),
//		httplimit.By(httplimit.Header("X-API-Key", "api_key"), httplimit.Route())))
package httplimit
