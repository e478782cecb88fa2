package limit

// Field names the part of a Limit that Validate refused, so that a caller that built the
// limit from something else (a rule file) can point at what its user wrote.
type Field uint8

// The fields Validate refuses; NoField for a refusal of several fields at once.
const (
	NoField Field = iota
	RateField
	PeriodField
	BurstField
	OverdraftField
	AlgorithmField
	WindowField
	SharedField
)

var fieldNames = [...]string{"", "rate", "period", "burst", "overdraft", "algorithm", "window", "global"}

func (f Field) String() string {
	if int(f) < len(fieldNames) {
		return fieldNames[f]
	}
	return "field?"
}

// An Error is Validate's refusal of a limit. It wraps ErrInvalid.
type Error struct {
	Field Field
	// Value is the refused field's value as the Limit holds it, or "" when Reason says it.
	Value string
	// Reason says why, phrased to follow the field's name and value ("must be > 0"); with
	// NoField it is the whole sentence.
	Reason string
}

func (e *Error) Error() string {
	s := "invalid limit: "
	if e.Field != NoField {
		s += e.Field.String() + " "
		if e.Value != "" {
			s += e.Value + " "
		}
	}
	return s + e.Reason
}

func (e *Error) Unwrap() error { return ErrInvalid }
