// Package redis is a backend.Backend that keeps rate-limit state in Redis, shared by every replica of
// rls: single node, Sentinel or Cluster, through github.com/redis/go-redis/v9.
//
// One Lua script (gcra.lua) decides a whole batch atomically, with the arithmetic of
// backend.Decide and backend.Refund in integer microseconds and time from Redis TIME, so replicas
// whose own clocks disagree still agree exactly. Each key stores only what its algorithm needs —
// under GCRA its theoretical arrival time as an exact rational and the rate and period it was
// computed under; a window's end and counts; a sliding log's instants — and expires at its
// reset, so an idle key costs nothing.
//
// A request costs one round trip. On a single node (or Sentinel) every key of a batch goes to one
// script call. On a Cluster the keys are spread over slots, so a batch is split into one script
// call per slot, pipelined in one round trip per node; when one slot refuses the batch, the
// charges the others made are undone in a second round trip (the only case with two).
//
// Around that: a local cache of denials (a key Redis denied for a cost until some instant is
// denied from memory until then, without a round trip: under every algorithm only time admits it
// again),
// optional coalescing of concurrent calls into pipelines, a timeout on every call and a circuit
// breaker that fails fast with backend.ErrUnavailable while Redis is down and probes for its
// return in the background.
package redis
