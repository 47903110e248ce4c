package sql92

import (
	"cmp"
	"errors"
	"math"
	"strconv"
	"strings"
)

// Kind is the Java type of a Value (the boxed types RocketMQ's filter
// compares).
type Kind uint8

// Value kinds. A broker's message properties are always String; the other
// kinds come from literals (Integer, Long, Double, Boolean) and from
// contexts that supply typed values (RocketMQ's own filter tests do).
const (
	Null   Kind = iota
	Bool        // java.lang.Boolean
	Int         // java.lang.Integer
	Long        // java.lang.Long
	Double      // java.lang.Double
	String      // java.lang.String
	Other       // any other object: not comparable
)

// Value is a value of the evaluation: a Java object of one of the Kinds.
type Value struct {
	K Kind
	B bool
	I int64 // Int (within int32) and Long
	F float64
	S string
}

// Values of convenience.
var (
	NullValue  = Value{}
	TrueValue  = Value{K: Bool, B: true}
	FalseValue = Value{K: Bool}
)

// StringValue returns a String value.
func StringValue(s string) Value { return Value{K: String, S: s} }

// IntValue returns an Integer value (v must be within int32).
func IntValue(v int32) Value { return Value{K: Int, I: int64(v)} }

// LongValue returns a Long value.
func LongValue(v int64) Value { return Value{K: Long, I: v} }

// DoubleValue returns a Double value.
func DoubleValue(v float64) Value { return Value{K: Double, F: v} }

// BoolValue returns a Boolean value.
func BoolValue(b bool) Value { return Value{K: Bool, B: b} }

func (v Value) isNull() bool   { return v.K == Null }
func (v Value) isNumber() bool { return v.K == Int || v.K == Long || v.K == Double }

// String renders v as Java's toString would (for messages).
func (v Value) String() string {
	switch v.K {
	case Null:
		return "null"
	case Bool:
		return strconv.FormatBool(v.B)
	case Int, Long:
		return strconv.FormatInt(v.I, 10)
	case Double:
		return strconv.FormatFloat(v.F, 'g', -1, 64)
	case String:
		return v.S
	}
	return "object"
}

// equals is Java's Object.equals on the boxed values: same class and equal
// value (Double compares by bits: NaN equals NaN, 0.0 differs from -0.0).
func (v Value) equals(o Value) bool {
	if v.K != o.K {
		return false
	}
	switch v.K {
	case Bool:
		return v.B == o.B
	case Int, Long:
		return v.I == o.I
	case Double:
		return doubleBits(v.F) == doubleBits(o.F)
	case String:
		return v.S == o.S
	}
	return false // Other: distinct objects
}

// doubleBits is Double.doubleToLongBits: every NaN maps to one value.
func doubleBits(f float64) uint64 {
	if f != f {
		return 0x7ff8000000000000
	}
	return math.Float64bits(f)
}

// errEval wraps the runtime exceptions of an evaluation: a message whose
// evaluation fails does not match (the broker catches them).
var errEval = errors.New("sql92: evaluation failed")

// errNotComparable is Java's ClassCastException where a value is not
// Comparable, or where the filter casts a Boolean to String.
var errNotComparable = &EvalError{Msg: "ClassCastException"}

// compareValues is Java's ComparisonExpression.__compare with
// convertStringExpressions (always on for parsed expressions): values of
// different classes are converted up, strings parsed into the other
// side's type (a NumberFormatException fails the evaluation), and pairs
// that cannot be converted compare as -1.
func compareValues(l, r Value) (int, error) {
	if l.K != r.K {
		switch l.K {
		case Bool:
			if r.K == String {
				// Java casts the Boolean itself to String here.
				return 0, errNotComparable
			}
			return -1, nil
		case Int:
			switch r.K {
			case Long:
				l.K = Long
			case Double:
				l = DoubleValue(float64(l.I))
			case String:
				n, err := parseJavaInt(r.S, 32)
				if err != nil {
					return 0, err
				}
				r = Value{K: Int, I: n}
			default:
				return -1, nil
			}
		case Long:
			switch r.K {
			case Int:
				r.K = Long
			case Double:
				l = DoubleValue(float64(l.I))
			case String:
				n, err := parseJavaInt(r.S, 64)
				if err != nil {
					return 0, err
				}
				r = LongValue(n)
			default:
				return -1, nil
			}
		case Double:
			switch r.K {
			case Int, Long:
				r = DoubleValue(float64(r.I))
			case String:
				f, err := parseJavaDouble(r.S)
				if err != nil {
					return 0, err
				}
				r = DoubleValue(f)
			default:
				return -1, nil
			}
		case String:
			switch r.K {
			case Bool:
				l = BoolValue(strings.EqualFold(l.S, "true"))
			case Int:
				n, err := parseJavaInt(l.S, 32)
				if err != nil {
					return 0, err
				}
				l = Value{K: Int, I: n}
			case Long:
				n, err := parseJavaInt(l.S, 64)
				if err != nil {
					return 0, err
				}
				l = LongValue(n)
			case Double:
				f, err := parseJavaDouble(l.S)
				if err != nil {
					return 0, err
				}
				l = DoubleValue(f)
			default:
				return -1, nil
			}
		default:
			return -1, nil
		}
	}
	switch l.K {
	case Bool:
		switch {
		case l.B == r.B:
			return 0, nil
		case l.B:
			return 1, nil
		}
		return -1, nil
	case Int, Long:
		return cmp.Compare(l.I, r.I), nil
	case Double:
		return compareDouble(l.F, r.F), nil
	case String:
		return compareJavaStrings(l.S, r.S), nil
	}
	return 0, errNotComparable
}

// compareDouble is Double.compare: -0.0 < 0.0, NaN above everything and
// equal to itself.
func compareDouble(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	ab, bb := int64(doubleBits(a)), int64(doubleBits(b))
	return cmp.Compare(ab, bb)
}

// compareJavaStrings orders by UTF-16 code units as String.compareTo; for
// the BMP that is the order of Go's byte-wise comparison of UTF-8, and the
// filter uses the sign only to tell equal from different.
func compareJavaStrings(a, b string) int { return strings.Compare(a, b) }

// parseJavaInt is Integer.parseInt (bits 32) or Long.parseLong (bits 64):
// an optional sign and decimal digits, nothing else, within range.
func parseJavaInt(s string, bits int) (int64, error) {
	digits := s
	if digits != "" && (digits[0] == '+' || digits[0] == '-') {
		digits = digits[1:]
	}
	if digits == "" {
		return 0, numberFormat(s)
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, numberFormat(s)
		}
	}
	n, err := strconv.ParseInt(s, 10, bits)
	if err != nil {
		return 0, numberFormat(s)
	}
	return n, nil
}

// parseJavaDouble is Double.parseDouble: surrounding characters up to ' '
// are trimmed; a sign, then "NaN", "Infinity", a decimal number with an
// optional exponent, or a hexadecimal one with a binary exponent; an
// optional f/F/d/D suffix. Values beyond the range become ±Infinity or 0,
// as in Java.
func parseJavaDouble(s string) (float64, error) {
	t := strings.TrimFunc(s, func(r rune) bool { return r <= ' ' })
	body := t
	neg := false
	if body != "" && (body[0] == '+' || body[0] == '-') {
		neg = body[0] == '-'
		body = body[1:]
	}
	switch body {
	case "NaN":
		return math.NaN(), nil
	case "Infinity":
		if neg {
			return math.Inf(-1), nil
		}
		return math.Inf(1), nil
	}
	if n := len(body); n > 0 {
		switch body[n-1] {
		case 'f', 'F', 'd', 'D':
			body = body[:n-1]
		}
	}
	if !javaFloatSyntax(body) {
		return 0, numberFormat(s)
	}
	f, err := strconv.ParseFloat(body, 64)
	if err != nil {
		var ne *strconv.NumError
		if !errors.As(err, &ne) || !errors.Is(ne.Err, strconv.ErrRange) {
			return 0, numberFormat(s)
		}
	}
	if neg {
		f = -f
	}
	return f, nil
}

// javaFloatSyntax accepts the unsigned, suffix-less forms of Java's
// floating literals: digits [. digits] [e[±]digits] with at least one
// digit, or 0x hexdigits [. hexdigits] p[±]digits.
func javaFloatSyntax(s string) bool {
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		i, n := 2, 0
		for i < len(s) && isHex(s[i]) {
			i, n = i+1, n+1
		}
		if i < len(s) && s[i] == '.' {
			i++
			for i < len(s) && isHex(s[i]) {
				i, n = i+1, n+1
			}
		}
		if n == 0 || i >= len(s) || (s[i] != 'p' && s[i] != 'P') {
			return false
		}
		return expDigits(s[i+1:])
	}
	i, n := 0, 0
	for i < len(s) && isDigit(s[i]) {
		i, n = i+1, n+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && isDigit(s[i]) {
			i, n = i+1, n+1
		}
	}
	if n == 0 {
		return false
	}
	if i == len(s) {
		return true
	}
	if s[i] != 'e' && s[i] != 'E' {
		return false
	}
	return expDigits(s[i+1:])
}

func expDigits(s string) bool {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') }

func numberFormat(s string) error {
	return &EvalError{Msg: "NumberFormatException: For input string: " + strconv.Quote(s)}
}

// EvalError is a runtime exception of an evaluation (Java's
// RuntimeException, NumberFormatException or ClassCastException): the
// message being filtered does not match.
type EvalError struct{ Msg string }

func (e *EvalError) Error() string { return "sql92: " + e.Msg }

// Unwrap makes every EvalError match errEval.
func (e *EvalError) Unwrap() error { return errEval }
