package state

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Codec encodes and decodes one type. Append appends v's encoding to dst;
// Decode must not retain b (it may be reused after Decode returns) and must
// return an error, never panic, on malformed input. ID names the encoding
// and is part of the job fingerprint: change it when the encoding changes.
// Map keys are ordered by their encodings.
type Codec[T any] interface {
	Append(dst []byte, v T) ([]byte, error)
	Decode(b []byte) (T, error)
	ID() string
}

// ErrDecode is wrapped by the built-in codecs' decoding errors.
var ErrDecode = errors.New("state: cannot decode value")

type jsonCodec[T any] struct{}

// JSONCodec encodes T with encoding/json (reflection: fine for state that is
// not on a per-record hot path; write a Codec for hot state).
func JSONCodec[T any]() Codec[T] { return jsonCodec[T]{} }

func (jsonCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("state: json encode: %w", err)
	}
	return append(dst, b...), nil
}

func (jsonCodec[T]) Decode(b []byte) (T, error) {
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("%w: json: %w", ErrDecode, err)
	}
	return v, nil
}

func (jsonCodec[T]) ID() string { var v T; return fmt.Sprintf("json:%T", v) }

type stringCodec struct{}

// StringCodec stores a string's bytes as they are.
func StringCodec() Codec[string] { return stringCodec{} }

func (stringCodec) Append(dst []byte, v string) ([]byte, error) { return append(dst, v...), nil }
func (stringCodec) Decode(b []byte) (string, error)             { return string(b), nil }
func (stringCodec) ID() string                                  { return "string" }

type bytesCodec struct{}

// BytesCodec stores a byte slice as it is; Decode returns a copy.
func BytesCodec() Codec[[]byte] { return bytesCodec{} }

func (bytesCodec) Append(dst []byte, v []byte) ([]byte, error) { return append(dst, v...), nil }
func (bytesCodec) Decode(b []byte) ([]byte, error)             { return append([]byte(nil), b...), nil }
func (bytesCodec) ID() string                                  { return "bytes" }

type int64Codec struct{}

// Int64Codec stores an int64 as 8 big-endian bytes with the sign bit
// flipped, so that the encodings sort like the numbers (useful for Map keys).
func Int64Codec() Codec[int64] { return int64Codec{} }

func (int64Codec) Append(dst []byte, v int64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(dst, uint64(v)^(1<<63)), nil
}

func (int64Codec) Decode(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: int64 needs 8 bytes, got %d", ErrDecode, len(b))
	}
	return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)), nil
}

func (int64Codec) ID() string { return "int64be" }

type uint64Codec struct{}

// Uint64Codec stores a uint64 as 8 big-endian bytes (ordered).
func Uint64Codec() Codec[uint64] { return uint64Codec{} }

func (uint64Codec) Append(dst []byte, v uint64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(dst, v), nil
}

func (uint64Codec) Decode(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: uint64 needs 8 bytes, got %d", ErrDecode, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

func (uint64Codec) ID() string { return "uint64be" }

type varintCodec struct{}

// VarintCodec stores an int64 as a zig-zag varint (compact, not ordered).
func VarintCodec() Codec[int64] { return varintCodec{} }

func (varintCodec) Append(dst []byte, v int64) ([]byte, error) {
	return binary.AppendVarint(dst, v), nil
}

func (varintCodec) Decode(b []byte) (int64, error) {
	v, n := binary.Varint(b)
	if n <= 0 || n != len(b) {
		return 0, fmt.Errorf("%w: bad varint (%d bytes)", ErrDecode, len(b))
	}
	return v, nil
}

func (varintCodec) ID() string { return "varint" }

type float64Codec struct{}

// Float64Codec stores a float64's IEEE 754 bits big-endian.
func Float64Codec() Codec[float64] { return float64Codec{} }

func (float64Codec) Append(dst []byte, v float64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(dst, math.Float64bits(v)), nil
}

func (float64Codec) Decode(b []byte) (float64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: float64 needs 8 bytes, got %d", ErrDecode, len(b))
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
}

func (float64Codec) ID() string { return "float64be" }
