// Package redis is a backend.Backend that keeps rate-limit state in Redis, shared by every replica of
// rls: single node, Sentinel or Cluster, through github.com/redis/go-redis/v9.
//
// One Lua script (decide.lua; its contract with Go is contract.go) decides a whole batch
// atomically, with the arithmetic of backend.Decide and backend.Refund in integer microseconds
// and time from Redis TIME, so replicas whose own clocks disagree still agree exactly. Each key stores only what its algorithm needs —
// under GCRA its theoretical arrival time as an exact rational and the rate and period it was
// computed under; a window's end and counts; a sliding log's instants — and expires at its
// reset, so an idle key costs nothing.
//
// A request costs one round trip. On a single node (or Sentinel) every key of a batch goes to one
// script call. On a Cluster the keys are spread over slots, so a batch is split into one script
// call per slot, sent to each slot's master; when one slot refuses the batch, the charges the
// others made are undone in a second round trip (the only case with two).
//
// Limits on requests in flight (limit.Concurrency) keep a sorted set per key instead, written
// by their own script (slots.lua, slots.go), decided before a batch's rates and undone with them.
//
// The backend is parts, each handed what it needs and none calling back into Backend (see
// ARCHITECTURE.md): the core, which decides (decide.go, top to bottom: the local cache, the
// plan, the send — route.go is the one seam between a single node and a Cluster —, the settle,
// the undo, what the cache learns); the leases layer over it when leases are on (lease.go); the
// single node or the Cluster's topology (topology.go), which owns the nodes; and the nodes.
//
// Each master (the single node, Sentinel's master, each master of a Cluster) is a node with its
// own clients, pipelines (internal/pipeline), circuit breaker (internal/breaker), probe and
// health check (node.go): a master that fails or hangs fails only the decisions on its keys,
// and its errors never land on another master's calls. A Cluster's slot map is rls's own
// (topology.go), reloaded on a redirect, a failed node or CLUSTERDOWN, every 250 ms while part
// of it is down and every 10 s otherwise; a master that leaves the map has its node closed. No
// script call that may have run is ever sent again. Every go-redis client is built in
// clients.go.
//
// Around that: a local cache of denials (a key Redis denied for a cost until some instant is
// denied from memory until then, without a round trip: under every algorithm only time admits it
// again), coalescing of concurrent calls into pipelines, a time budget on every decision (a
// decision that runs out of it while its master does not answer a probe either counts as Redis
// slow, otherwise as overload), and an epoch key per master whose loss says Redis lost its data.
package redis
