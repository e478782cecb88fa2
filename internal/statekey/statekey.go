// Package statekey is the encoding of the keys under which rls keeps a limit's state: each
// field (domain, a descriptor entry's key and value, a limit's name) written with its length
// first, "<len>:<bytes>", so that no two different lists of fields encode alike ("a_b"+"c"
// against "a"+"b_c"). The service's backend keys, the rule loader's key tags and the client's
// local tier all write their fields through it. It imports nothing but the standard library,
// so that the client package may use it.
package statekey

import "strconv"

// AppendField appends s to b as one length-prefixed field, "<len(s)>:<s>".
func AppendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
