package limit

// Bounds on a request and on a rule file, the same on both sides: the server answers a larger
// request InvalidArgument, the loader rejects a larger rule, and the client refuses to send one.
const (
	// MaxDescriptors is the most descriptors one request may carry.
	MaxDescriptors = 64
	// MaxEntries is the most entries one descriptor may carry, and the deepest a rule tree
	// may nest.
	MaxEntries = 32
	// MaxKeyBytes is the longest descriptor key, in bytes.
	MaxKeyBytes = 256
	// MaxValueBytes is the longest descriptor value, in bytes.
	MaxValueBytes = 4096
)
