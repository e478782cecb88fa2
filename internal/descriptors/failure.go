package descriptors

import "fmt"

// FailureMode is what rls answers for a descriptor when its backend is unavailable (down, timed
// out, circuit open, or this process overloaded). The zero value, FailureDefault, defers to the
// server's --failure-mode.
type FailureMode uint8

const (
	// FailureDefault: the rule sets none; the server's default applies.
	FailureDefault FailureMode = iota
	// FailureError answers gRPC UNAVAILABLE, so Envoy's own failure_mode_deny decides.
	FailureError
	// FailureAllow answers OK.
	FailureAllow
	// FailureDeny answers OVER_LIMIT.
	FailureDeny
	// FailureLocal decides with this process's memory backend, from the same rules: each
	// replica then enforces the limit on its own.
	FailureLocal
)

// FailureModes are the accepted values of a rule's failure_mode.
var FailureModes = []string{"allow", "deny", "error", "local"}

// ParseFailureMode parses "error", "allow", "deny" or "local".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "error":
		return FailureError, nil
	case "allow":
		return FailureAllow, nil
	case "deny":
		return FailureDeny, nil
	case "local":
		return FailureLocal, nil
	}
	return FailureDefault, fmt.Errorf("failure mode %q: want error, allow, deny or local", s)
}

func (m FailureMode) String() string {
	switch m {
	case FailureError:
		return "error"
	case FailureAllow:
		return "allow"
	case FailureDeny:
		return "deny"
	case FailureLocal:
		return "local"
	}
	return ""
}
