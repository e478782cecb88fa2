// Package ratelimitenv reads envoyproxy/ratelimit's environment variables and says which rls
// flags they amount to, so that rls can replace envoyproxy/ratelimit in a deployment by a change
// of image.
//
// Translate is pure: it reads only the environment it is given and touches no file. Its result
// names, for every flag value, the variables it came from, and for every variable rls cannot
// honour as given, what rls does instead; the caller applies the values below its own flags and
// RLS_* variables and logs the notices once.
//
// The environment counts as envoyproxy/ratelimit's only when a variable that no other program is
// likely to set is present (CONFIG_TYPE, RUNTIME_ROOT, REDIS_SOCKET_TYPE, USE_STATSD, ...; see
// Distinctive). HOST, PORT, LOG_LEVEL or REDIS_URL alone are common names and do not count: a
// container that sets REDIS_URL for some other purpose must not turn rls into a Redis client
// reading rules from /srv/runtime_data/current.
//
// A variable set to the empty string is treated as not set, so its default applies
// (envoyproxy/ratelimit's own parser rejects an empty number, duration or boolean).
package ratelimitenv
