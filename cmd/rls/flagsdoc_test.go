package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// flagsDoc is the flag reference, relative to this package.
var flagsDoc = filepath.Join("..", "..", "docs", "flags.md")

// TestFlagsDoc keeps docs/flags.md equal to the flag definitions: every command's flags, with
// their RLS_* variables, types, defaults and help. RLS_UPDATE_FLAGS_DOC=1 writes it instead.
func TestFlagsDoc(t *testing.T) {
	want := renderFlagsDoc()
	if os.Getenv("RLS_UPDATE_FLAGS_DOC") == "1" {
		if err := os.WriteFile(flagsDoc, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatalf("%v; run RLS_UPDATE_FLAGS_DOC=1 go test ./cmd/rls -run TestFlagsDoc", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		line := 0
		for line < len(gl) && line < len(wl) && gl[line] == wl[line] {
			line++
		}
		var g, w string
		if line < len(gl) {
			g = gl[line]
		}
		if line < len(wl) {
			w = wl[line]
		}
		t.Fatalf("docs/flags.md is stale: run RLS_UPDATE_FLAGS_DOC=1 go test ./cmd/rls -run TestFlagsDoc\nfirst difference, line %d:\n have %q\n want %q", line+1, g, w)
	}
}

// flagPage is the page of docs/ that explains a serve flag at length, in its "Flags" section.
func flagPage(name string) string {
	switch {
	case strings.HasPrefix(name, "xds-"), name == "start-without-rules", name == "ready-with-rules":
		return "gateways.md"
	case name == "ratelimit-env":
		return "migrating.md"
	case name == "overdraft":
		return "usage-limits.md"
	case strings.HasPrefix(name, "rlqs"):
		return "rlqs.md"
	case strings.HasPrefix(name, "redis-"):
		return "redis.md"
	case strings.HasPrefix(name, "decision-log"):
		return "replay.md"
	case name == "region", strings.HasPrefix(name, "global-"):
		return "multi-region.md"
	case strings.HasPrefix(name, "grpc-tls-"), strings.HasPrefix(name, "http-tls-"), name == "caller-policy", name == "admin-token-file":
		return "security.md"
	case strings.HasPrefix(name, "config"), name == "merge-domains", name == "shadow-mode", name == "quota-mode",
		name == "overrides", name == "override-max-period", strings.HasPrefix(name, "response-header"):
		return "rules.md"
	}
	return "operating.md"
}

// renderFlagsDoc renders docs/flags.md from the commands' flag sets.
func renderFlagsDoc() []byte {
	var b bytes.Buffer
	b.WriteString(`# Flags

This page lists every flag of every rls command, generated from the flag definitions in ` + "`cmd/rls`" + `
(` + "`RLS_UPDATE_FLAGS_DOC=1 go test ./cmd/rls -run TestFlagsDoc`" + ` writes it; the test fails while it
is stale). ` + "`rls help COMMAND`" + ` prints the same. A flag on the command line wins over its
` + "`RLS_*`" + ` variable, which wins over envoyproxy/ratelimit's variables
([migrating.md](migrating.md#environment-variables)). Each serve flag links to the page that explains it.
`)
	for _, c := range commands {
		fs := commandFlags(c)
		if shownFlags(fs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n`%s`: %s.\n", c.name, c.synopsis, c.summary)
		cols := "| flag | variable | type | default | what |\n|---|---|---|---|---|\n"
		if !c.env {
			cols = "| flag | type | default | what |\n|---|---|---|---|\n"
		}
		if c.name != "serve" {
			b.WriteString("\n" + cols)
			flagRows(&b, c, fs, func(*flag.Flag) bool { return true })
			continue
		}
		for _, g := range serveGroups {
			fmt.Fprintf(&b, "\n### %s\n\n%s", g.title, cols)
			flagRows(&b, c, fs, func(f *flag.Flag) bool { return serveGroup(f.Name) == g.name })
		}
	}
	return b.Bytes()
}

// flagRows writes the table rows of the flags of c's flag set fs that keep reports true of.
func flagRows(b *bytes.Buffer, c command, fs *flag.FlagSet, keep func(*flag.Flag) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if hidden(f) || !keep(f) {
			return
		}
		name := "`--" + f.Name + "`"
		if c.name == "serve" {
			name = "[" + name + "](" + flagPage(f.Name) + "#flags)"
		}
		def := ""
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		if c.env {
			fmt.Fprintf(b, "| %s | `%s` | %s | %s | %s |\n", name, envName(f.Name), flagType(f), def, markdownText(f.Usage))
		} else {
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, flagType(f), def, markdownText(f.Usage))
		}
	})
}

// markdownText escapes what Markdown would read as markup in a table cell.
func markdownText(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune("\\`*_[]<>|", r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestFlagPagesExplainFlags: the "Flags" section of the page docs/flags.md links each serve flag
// to names that flag, and names no flag serve does not have.
func TestFlagPagesExplainFlags(t *testing.T) {
	serve, _ := lookupCommand("serve")
	fs := commandFlags(serve)
	sections := map[string]string{}
	section := func(page string) string {
		if s, ok := sections[page]; ok {
			return s
		}
		b, err := os.ReadFile(filepath.Join("..", "..", "docs", page))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		i := strings.Index(s, "\n## Flags\n")
		if i < 0 {
			t.Fatalf("docs/%s has no \"## Flags\" section", page)
		}
		s = s[i+len("\n## Flags\n"):]
		if j := strings.Index(s, "\n## "); j >= 0 {
			s = s[:j]
		}
		sections[page] = s
		return s
	}
	fs.VisitAll(func(f *flag.Flag) {
		if testingOnly(f) {
			return
		}
		if page := flagPage(f.Name); !strings.Contains(section(page), "`--"+f.Name+"`") {
			t.Errorf("--%s: docs/%s's Flags section does not name it", f.Name, page)
		}
	})
	for page, s := range sections {
		for _, line := range strings.Split(s, "\n") {
			if !strings.HasPrefix(line, "| `--") {
				continue
			}
			cell := strings.SplitN(line, "|", 3)[1]
			for _, name := range strings.Split(cell, ",") {
				name = strings.Trim(strings.TrimSpace(name), "`")
				if f := fs.Lookup(strings.TrimPrefix(name, "--")); f == nil {
					t.Errorf("docs/%s names %s, which serve does not have", page, name)
				} else if flagPage(f.Name) != page {
					t.Errorf("docs/%s names %s, which docs/flags.md links to docs/%s", page, name, flagPage(f.Name))
				}
			}
		}
	}
}
