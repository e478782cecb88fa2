// Package statsd keeps envoyproxy/ratelimit's counters and sends them where its environment
// sent them: to a statsd server, plain or DogStatsD, every flush interval, and as Prometheus
// series named as envoyproxy/ratelimit's default statsd mapper names them.
//
// Store is the counters, told each descriptor decision by the service (service.Stats): one
// series per rule, named as envoyproxy/ratelimit names its stats key (domain, then key_value or
// key per level, "shop.api_key.path_/a"), with a rule's request values only when the rule asks
// (detailed_metric, value_to_metric), at most a cap of them per rule and of series in all. A
// decision costs a map read under a read lock and atomic adds: nothing on the decision path
// waits on the network.
//
// Sink reads the Store and a Prometheus gatherer (for the counters rls keeps anyway: backend
// errors, rule loads, calls) on its own goroutine every interval and sends what changed since the
// last flush over UDP, without waiting: a statsd server that is down, slow or black-holed loses
// datagrams and slows nothing. Collector serves the same counters to Prometheus.
package statsd
