package yamlnode

import (
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestMapping: the same file walked with aliases followed (rule files) and refused (caller
// policies), each error at its line.
func TestMapping(t *testing.T) {
	const file = "base: &b {a: 1}\nm:\n  <<: *b\n  b: *b\n  a: 2\n  c: 3\n  b: 4\n"
	doc, second, errs := Read([]byte(file))
	if doc == nil || second != 0 || errs != nil {
		t.Fatalf("Read: %v %d %v", doc, second, errs)
	}
	m := Field(doc, "m")
	for _, tc := range []struct {
		aliases bool
		want    string
	}{
		{true, "b@4 | a@5 | 6: unknown key c in m (known: a, b) | 7: key b set twice in m"},
		{false, "3: merge keys (<<) are not supported in a test | 4: b: anchors and aliases are not supported in a test | a@5 | 6: unknown key c in m (known: a, b) | b@7"},
	} {
		var got []string
		d := Decoder{Aliases: tc.aliases, Format: "a test", Errorf: func(line int, format string, args ...any) {
			got = append(got, fmt.Sprintf("%d: ", line)+fmt.Sprintf(format, args...))
		}}
		d.Mapping(m, "m", []string{"a", "b"}, func(_ int, k, v *yaml.Node) { got = append(got, fmt.Sprintf("%s@%d", k.Value, k.Line)) })
		if all := strings.Join(got, " | "); all != tc.want {
			t.Errorf("aliases %v:\n got %s\nwant %s", tc.aliases, all, tc.want)
		}
	}
}

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		file   string
		doc    bool
		second int
		err    string
	}{
		{"", false, 0, ""},
		{"a: 1\n---\nb: 2\n", true, 3, ""},
		{"---\n---\n", false, 0, ""},
		{"a: [\n", false, 0, "x.yaml:"},
	} {
		doc, second, errs := Read([]byte(tc.file))
		if (doc != nil) != tc.doc || second != tc.second || (tc.err == "") != (len(errs) == 0) ||
			(len(errs) > 0 && !strings.HasPrefix(FileError("x.yaml", errs[0]).Error(), tc.err)) {
			t.Errorf("Read(%q) = %v, %d, %v", tc.file, doc, second, errs)
		}
	}
}
