package client

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/rls-project/rls/internal/limit"
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

// MaxValueBytes is the longest descriptor value rls accepts. The client checks a request
// against the very bounds rls enforces (see rls's docs/rules.md, "How a request is answered") before it sends it.
const MaxValueBytes = limit.MaxValueBytes

func validate(descs []Descriptor) error {
	if len(descs) == 0 {
		return fmt.Errorf("%w: no descriptors", ErrInvalid)
	}
	if len(descs) > limit.MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrInvalid, len(descs), limit.MaxDescriptors)
	}
	for i, d := range descs {
		if len(d) == 0 {
			return fmt.Errorf("%w: descriptor %d has no entries", ErrInvalid, i)
		}
		if len(d) > limit.MaxEntries {
			return fmt.Errorf("%w: descriptor %d has %d entries, at most %d", ErrInvalid, i, len(d), limit.MaxEntries)
		}
		for j, e := range d {
			switch {
			case e.Key == "":
				return fmt.Errorf("%w: descriptor %d entry %d: empty key", ErrInvalid, i, j)
			case len(e.Key) > limit.MaxKeyBytes:
				return fmt.Errorf("%w: descriptor %d entry %d: key longer than %d bytes", ErrInvalid, i, j, limit.MaxKeyBytes)
			case len(e.Value) > limit.MaxValueBytes:
				return fmt.Errorf("%w: descriptor %d entry %d: value longer than %d bytes", ErrInvalid, i, j, limit.MaxValueBytes)
			case !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value):
				return fmt.Errorf("%w: descriptor %d entry %d: not valid UTF-8", ErrInvalid, i, j)
			}
		}
	}
	return nil
}
