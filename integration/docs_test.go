package integration

import (
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks: every relative link in every Markdown file of the repository resolves to a file
// or directory that exists, and every #anchor to a heading of the file it names, slugged as
// GitHub slugs headings.
func TestDocLinks(t *testing.T) {
	root := repoRoot()
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("found %d Markdown files under %s, want README.md, docs/ and the rest", len(files), root)
	}
	anchors := map[string]map[string]bool{} // file → its anchors, read when first linked to
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, l := range markdownLinks(string(b)) {
			if isExternal(l.target) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := file
			if path != "" {
				if strings.HasPrefix(path, "/") {
					target = filepath.Join(root, filepath.FromSlash(path))
				} else {
					target = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				}
				if r, err := filepath.Rel(root, target); err != nil || strings.HasPrefix(r, "..") {
					t.Errorf("%s:%d: link %q leaves the repository", rel, l.line, l.target)
					continue
				}
				info, err := os.Stat(target)
				if err != nil {
					t.Errorf("%s:%d: link %q: no such file or directory", rel, l.line, l.target)
					continue
				}
				if info.IsDir() {
					if anchor != "" {
						t.Errorf("%s:%d: link %q: an anchor into a directory", rel, l.line, l.target)
					}
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				continue // a line anchor (#L10) into source, which GitHub resolves itself
			}
			if !anchorsOf(target)[anchor] {
				t.Errorf("%s:%d: link %q: no heading with the anchor #%s in %s", rel, l.line, l.target, anchor, filepath.Base(target))
			}
		}
	}
	if checked < 100 {
		t.Errorf("checked %d relative links, want the docs' hundreds", checked)
	}
}

// markdownFiles returns every *.md file under root, leaving out directories whose names start
// with '.' (.git) and testdata.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

type mdLink struct {
	line   int
	target string
}

var (
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// markdownLinks returns the targets of the inline links and link definitions of a Markdown
// text, outside fenced code blocks and code spans.
func markdownLinks(text string) []mdLink {
	var links []mdLink
	for i, line := range proseLines(text) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			links = append(links, mdLink{i, strings.Trim(m[1], "<>")})
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			links = append(links, mdLink{i, strings.Trim(m[1], "<>")})
		}
	}
	return links
}

// proseLines yields a Markdown text's lines outside fenced code blocks, with their numbers from 1.
func proseLines(text string) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		fence := ""
		for i, line := range strings.Split(text, "\n") {
			if f := fenceOf(line); f != "" {
				switch {
				case fence == "":
					fence = f
					continue
				case strings.HasPrefix(f, fence):
					fence = ""
					continue
				}
			}
			if fence == "" && !yield(i+1, line) {
				return
			}
		}
	}
}

// fenceOf returns the fence (``` or ~~~, as long as written) a line opens or closes, or "".
func fenceOf(line string) string {
	s := strings.TrimLeft(line, " ")
	if len(line)-len(s) > 3 {
		return ""
	}
	for _, c := range []string{"`", "~"} {
		n := len(s) - len(strings.TrimLeft(s, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

func isExternal(target string) bool {
	if target == "" {
		return true
	}
	if i := strings.Index(target, ":"); i > 0 && !strings.ContainsAny(target[:i], "/#.") {
		return true // http:, https:, mailto:
	}
	return strings.HasPrefix(target, "//")
}

// headingAnchors returns the anchors GitHub gives a Markdown text's ATX headings (and any
// <a name> or id it holds): each heading's slug, a repeated one suffixed -1, -2...
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		h := strings.TrimLeft(line, " ")
		if len(line)-len(h) > 3 || !strings.HasPrefix(h, "#") {
			continue
		}
		level := len(h) - len(strings.TrimLeft(h, "#"))
		if level > 6 || (len(h) > level && h[level] != ' ' && h[level] != '\t') {
			continue
		}
		slug := slugify(h[level:])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

var (
	mdLinkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	closingATX = regexp.MustCompile(`\s+#+\s*$`)
)

// slugify is GitHub's anchor for a heading's text: the text as rendered (links as their text,
// no code or emphasis marks), lower-cased, with every character but letters, digits, spaces,
// '-' and '_' dropped and each space turned into '-'.
func slugify(heading string) string {
	s := strings.TrimSpace(closingATX.ReplaceAllString(heading, ""))
	s = mdLinkText.ReplaceAllString(s, "$1")
	s = strings.NewReplacer("`", "", "*", "").Replace(s)
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestSlugify pins slugify to anchors GitHub gave this repository's headings.
func TestSlugify(t *testing.T) {
	for heading, want := range map[string]string{
		"Moving from envoyproxy/ratelimit":                                         "moving-from-envoyproxyratelimit",
		"Usage-based limits (LLM tokens)":                                          "usage-based-limits-llm-tokens",
		"Time budget, overload and the circuit breaker":                            "time-budget-overload-and-the-circuit-breaker",
		"Redis faults: what callers see":                                           "redis-faults-what-callers-see",
		"When to choose RLQS over `ShouldRateLimit`":                               "when-to-choose-rlqs-over-shouldratelimit",
		"Today's figures":                                                          "todays-figures",
		"Token limits (envoy-tokens.yaml)":                                         "token-limits-envoy-tokensyaml",
		"At commit e10271e: what the Redis path costs rls, without gRPC around it": "at-commit-e10271e-what-the-redis-path-costs-rls-without-grpc-around-it",
		"The `share_threshold` key ##":                                             "the-share_threshold-key",
		"A [linked](x.md) heading":                                                 "a-linked-heading",
	} {
		if got := slugify(heading); got != want {
			t.Errorf("slugify(%q) = %q, want %q", heading, got, want)
		}
	}
	got := headingAnchors("# A\n## A\n```\n# Not a heading\n```\n### A\n#NoSpace\n")
	for _, want := range []string{"a", "a-1", "a-2"} {
		if !got[want] {
			t.Errorf("headingAnchors: no %q in %v", want, got)
		}
	}
	if got["not-a-heading"] || got["nospace"] || len(got) != 3 {
		t.Errorf("headingAnchors: %v, want a, a-1 and a-2 only", got)
	}
}

// TestDocPages: the README stays a short entry point, and every page of docs/ opens with its
// title and a line on what it covers, so a newcomer can tell the pages apart from their tops.
func TestDocPages(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 250 {
		t.Errorf("README.md has %d lines, want at most 250: move the detail to a page of docs/", n)
	}
	docsMap := string(readme)
	if i := strings.Index(docsMap, "\n## Where to read on\n"); i >= 0 {
		docsMap = docsMap[i:]
		if j := strings.Index(docsMap[1:], "\n## "); j >= 0 {
			docsMap = docsMap[:j+1]
		}
	} else {
		t.Error(`README.md has no "## Where to read on" section, the map of docs/`)
	}
	pages, err := filepath.Glob(filepath.Join(repoRoot(), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 12 {
		t.Errorf("docs/ has %d pages, want at least 12", len(pages))
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(string(b), "\n", 4)
		if len(lines) < 3 || !strings.HasPrefix(lines[0], "# ") || lines[1] != "" || !strings.HasPrefix(lines[2], "This page ") {
			t.Errorf("docs/%s does not open with \"# Title\", a blank line and \"This page covers...\"", filepath.Base(page))
		}
		if !strings.Contains(docsMap, "(docs/"+filepath.Base(page)+")") {
			t.Errorf("README.md's map of docs/ does not link docs/%s", filepath.Base(page))
		}
	}
}
