package descriptors

// The text form of a descriptor, key=value[,key=value...], as rls check, rls inspect, rls reset
// and /v1/keys read it (service.ParseDescriptor): a ',', '=' or '%' in a key or value is
// written %2C, %3D or %25, so that any descriptor written here reads back as itself.

// AppendEscaped appends a key or value of a descriptor's text form to b.
func AppendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ',':
			b = append(b, "%2C"...)
		case '=':
			b = append(b, "%3D"...)
		case '%':
			b = append(b, "%25"...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// AppendEntry appends one entry, key=value, of a descriptor's text form to b.
func AppendEntry(b []byte, key, value string) []byte {
	b = AppendEscaped(b, key)
	b = append(b, '=')
	return AppendEscaped(b, value)
}

// Text writes entries in the text form.
func Text(entries []Entry) string {
	var b []byte
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendEntry(b, e.Key, e.Value)
	}
	return string(b)
}
