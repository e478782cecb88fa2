// Package limit holds what a rate limit is, as every other package of rls speaks of it: the
// Limit value (rate, period, burst, overdraft, algorithm, window) and its validation, the
// algorithms' names, calendar windows, the units of time with their one table of names and
// lengths, and the bounds on a request. It imports nothing of rls: the rule loader
// (internal/descriptors), the stores (internal/backend), the service, RLQS and the client all
// build on it, none on another for these.
package limit
