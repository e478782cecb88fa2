package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/rls-project/rls/internal/policy"
)

// policyFlags registers the caller policy's flag on fs.
func policyFlags(fs *flag.FlagSet, file *string) {
	fs.StringVar(file, "caller-policy", *file,
		"YAML caller policy: by client certificate name (mTLS), the domains a caller may ask about and whether it may refund, override or send more than max_hits hits; callers without a certificate (plaintext gRPC, POST /json) get its default entry; reloaded when it changes (empty: every caller may do everything)")
}

// validatePolicy is rls validate --caller-policy: it loads the file and says what it holds.
func validatePolicy(path string, stdout io.Writer) error {
	p, err := policy.Load(path)
	if err != nil {
		return fmt.Errorf("--caller-policy: %w", err)
	}
	def := "none: callers it does not name are refused"
	if p.Default != nil {
		def = fmt.Sprintf("domains %q", p.Default.Domains)
	}
	fmt.Fprintf(stdout, "ok: caller policy %s: %d caller entries; default %s\n", path, len(p.Callers), def)
	return nil
}
