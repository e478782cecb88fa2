package redis

// Test hooks and views of the package's internals, for its tests only.

// epochKnown reports whether the node's epoch is known.
func (n *node) epochKnown() bool { return n.epochSet.Load() }
