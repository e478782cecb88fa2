package statekey

import "testing"

// TestFieldsNeverEncodeAlike: different lists of fields never give the same encoding, whatever
// separators their bytes hold.
func TestFieldsNeverEncodeAlike(t *testing.T) {
	lists := [][]string{{"a_b", "c"}, {"a", "b_c"}, {"a:b", "c"}, {"a", "b:c"}, {"1:a", ""}, {"", "1:a"}, {"ab"}, {"a", "b"}, {}, {""}}
	seen := map[string]int{}
	for i, l := range lists {
		var b []byte
		for _, f := range l {
			b = AppendField(b, f)
		}
		if j, dup := seen[string(b)]; dup {
			t.Fatalf("%q and %q both encode as %q", lists[j], l, b)
		}
		seen[string(b)] = i
	}
	if got := string(AppendField([]byte("n"), "daily")); got != "n5:daily" {
		t.Fatalf("AppendField = %q, want n5:daily", got)
	}
}
