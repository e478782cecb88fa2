package main

import (
	"fmt"
	"io"

	"github.com/rls-project/rls/internal/version"
)

// runVersion is `rls version` and `rls --version`: which rls this is, on stdout.
func runVersion(args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		return errHelp
	case len(args) > 0:
		fmt.Fprintln(stderr, "usage: rls version (or rls --version)")
		return errUsage
	}
	fmt.Fprintln(stdout, "rls", version.Get())
	return nil
}
