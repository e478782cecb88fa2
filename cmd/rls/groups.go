package main

import "strings"

// serveGroups are the concerns serve's flags are grouped by, in the order the help and the flag
// reference show them.
var serveGroups = []struct{ name, title string }{
	{"listeners", "Listeners: addresses, TLS, connections, shutdown"},
	{"rules", "Rules: files, xDS, modes, response headers"},
	{"state", "State: the backend, memory and Redis"},
	{"failure", "Failure: when the backend cannot answer"},
	{"clients", "Limits on clients: sizes, rates, timeouts, who may do what"},
	{"regions", "Regions: one limit across regions"},
	{"rlqs", "RLQS: the Rate Limit Quota Service"},
	{"observability", "Observability: logs, metrics, debugging"},
}

// serveGroup is the concern of serve's flag name, one of serveGroups' names; "" for a flag no
// group claims, which TestServeFlagsGrouped refuses.
func serveGroup(name string) string {
	switch name {
	case "grpc-addr", "http-addr", "http-tls-cert", "http-tls-key", "http-tls-client-ca", "grpc-reflection", "grpc-keepalive-min-time", "grpc-max-connection-age",
		"grpc-max-connection-age-grace", "grpc-max-connection-idle", "grpc-stream-workers",
		"shutdown-delay", "shutdown-timeout":
		return "listeners"
	case "grpc-max-connections", "grpc-max-connections-per-source", "grpc-max-calls", "grpc-max-concurrent-streams",
		"grpc-handshake-timeout", "grpc-message-timeout", "caller-policy", "admin-token-file", "overrides",
		"override-max-period":
		return "clients"
	case "merge-domains", "reload-debounce", "start-without-rules", "ready-with-rules", "shadow-mode", "quota-mode",
		"overdraft", "response-headers", "ratelimit-env":
		return "rules"
	case "backend", "memory-max-bytes", "memory-max-keys":
		return "state"
	case "failure-mode":
		return "failure"
	case "region":
		return "regions"
	case "debug", "debug-addr", "metrics-addr", "metrics-path", "near-limit-ratio", "detailed-metric-values",
		"ratelimit-metrics":
		return "observability"
	}
	for _, p := range []struct{ prefix, group string }{
		{"grpc-tls-", "listeners"}, {"http-", "clients"}, {"max-", "clients"}, {"config", "rules"}, {"xds-", "rules"},
		{"response-header-", "rules"}, {"redis-", "state"}, {"rlqs", "rlqs"}, {"log-", "observability"},
		{"global-", "regions"}, {"statsd-", "observability"}, {"decision-log", "observability"}, {"top-", "observability"},
	} {
		if strings.HasPrefix(name, p.prefix) {
			return p.group
		}
	}
	return ""
}
