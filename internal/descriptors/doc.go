// Package descriptors loads rule files (envoyproxy/ratelimit's YAML format, see package api)
// into an immutable, prebuilt tree, and matches request descriptors against it.
//
// Matching is the reference service's: for each entry of a request descriptor, in order, the
// node whose key and value equal the entry's, else the first wildcard value (in file order) that
// matches, else the key's default (a node with no value). The limit is that of the node matched by
// the last entry. A miss, or a request with more entries than the tree is deep, has no limit;
// there is no backtracking. All matching work is done at load time: Match allocates nothing.
package descriptors
