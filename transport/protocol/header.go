package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrBadHeader is wrapped by the error a generated header's Decode returns
// when a required extField is missing or a number does not parse. The error
// text names the key.
var ErrBadHeader = errors.New("protocol: bad header")

// CustomHeader is a typed view of a command's extFields: every generated
// *XxxHeader type implements it. Encode sets the fields as extFields of c;
// Decode resets the header and fills it from c's extFields.
type CustomHeader interface {
	Encode(c *Command)
	Decode(c *Command) error
}

// Opt is an optional number or boolean header field. Set reports whether the
// field is present; an absent field is not encoded, and a decoded field that
// was absent has Set false. The protocol cares in places: an absent
// setZeroIfNotFound or committed is not the same as false.
type Opt[T int32 | int64 | bool] struct {
	V   T
	Set bool
}

// Some returns a set Opt holding v.
func Some[T int32 | int64 | bool](v T) Opt[T] { return Opt[T]{V: v, Set: true} }

// Get returns the value and whether it is set.
func (o Opt[T]) Get() (T, bool) { return o.V, o.Set }

// Or returns the value if set, otherwise def.
func (o Opt[T]) Or(def T) T {
	if o.Set {
		return o.V
	}
	return def
}

func missingField(key string) error {
	return fmt.Errorf("%w: missing required field %q", ErrBadHeader, key)
}

// parseInt32 parses a decimal int32 as Java's Integer.parseInt does.
func parseInt32(key, s string) (int32, error) {
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: field %q: %q is not an int32", ErrBadHeader, key, s)
	}
	return int32(v), nil
}

// parseInt64 parses a decimal int64 as Java's Long.parseLong does.
func parseInt64(key, s string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: field %q: %q is not an int64", ErrBadHeader, key, s)
	}
	return v, nil
}

// parseBool follows Java's Boolean.parseBoolean: only "true", in any case,
// is true; anything else, garbage included, is false.
func parseBool(s string) bool { return strings.EqualFold(s, "true") }
