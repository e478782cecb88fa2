package client

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Entry is one key/value pair of a descriptor.
type Entry struct {
	Key   string
	Value string
}

// Descriptor is one rate-limit descriptor: entries in order, from the most general to the most
// specific, as rls's rules nest them (for example api_key=k1, then path=/search). A Descriptor
// is a value: With returns a new one and never changes its receiver.
type Descriptor []Entry

// Desc returns the descriptor with the one entry key=value.
func Desc(key, value string) Descriptor { return Descriptor{{Key: key, Value: value}} }

// RemoteAddress returns the descriptor remote_address=ip, the key Envoy's remote_address action
// uses. ip has no port; an IPv6 address has no brackets.
func RemoteAddress(ip string) Descriptor { return Desc("remote_address", ip) }

// GenericKey returns the descriptor generic_key=value, as Envoy's generic_key action sends it.
func GenericKey(value string) Descriptor { return Desc("generic_key", value) }

// With returns d followed by the entry key=value: a composite key such as
// Desc("api_key", k).With("path", p).
func (d Descriptor) With(key, value string) Descriptor {
	out := make(Descriptor, len(d), len(d)+1)
	copy(out, d)
	return append(out, Entry{Key: key, Value: value})
}

// String renders d as key=value pairs joined by commas, for messages (a QuotaFailure's subject).
// Keys and values are written as they are: rls check reads a ',', '=' or '%' in one only
// percent-encoded (%2C, %3D, %25).
func (d Descriptor) String() string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// ErrInvalid is returned, wrapped, for a request rls would reject or did reject
// (INVALID_ARGUMENT). It is a bug in the caller: no failure policy answers it.
var ErrInvalid = errors.New("client: invalid request")

// Bounds rls enforces on a request; see rls's README.
const (
	// MaxValueBytes is the longest descriptor value rls accepts.
	MaxValueBytes = maxValueBytes

	maxDescriptors = 64
	maxEntries     = 32
	maxKeyBytes    = 256
	maxValueBytes  = 4096
)

func validate(descs []Descriptor) error {
	if len(descs) == 0 {
		return fmt.Errorf("%w: no descriptors", ErrInvalid)
	}
	if len(descs) > maxDescriptors {
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrInvalid, len(descs), maxDescriptors)
	}
	for i, d := range descs {
		if len(d) == 0 {
			return fmt.Errorf("%w: descriptor %d has no entries", ErrInvalid, i)
		}
		if len(d) > maxEntries {
			return fmt.Errorf("%w: descriptor %d has %d entries, at most %d", ErrInvalid, i, len(d), maxEntries)
		}
		for j, e := range d {
			switch {
			case e.Key == "":
				return fmt.Errorf("%w: descriptor %d entry %d: empty key", ErrInvalid, i, j)
			case len(e.Key) > maxKeyBytes:
				return fmt.Errorf("%w: descriptor %d entry %d: key longer than %d bytes", ErrInvalid, i, j, maxKeyBytes)
			case len(e.Value) > maxValueBytes:
				return fmt.Errorf("%w: descriptor %d entry %d: value longer than %d bytes", ErrInvalid, i, j, maxValueBytes)
			case !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value):
				return fmt.Errorf("%w: descriptor %d entry %d: not valid UTF-8", ErrInvalid, i, j)
			}
		}
	}
	return nil
}
