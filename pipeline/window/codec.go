package window

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/runnel-dev/runnel/pipeline"
)

// errDecode is wrapped by the window state codecs' decoding errors.
var errDecode = errors.New("window: cannot decode state")

const signBit = 1 << 63

// spanCodec encodes a window as start | end, 8 bytes big-endian each with
// the sign bit flipped, so that encodings sort by start, then end.
type spanCodec struct{}

func (spanCodec) Append(dst []byte, s span) ([]byte, error) {
	dst = binary.BigEndian.AppendUint64(dst, uint64(s.start)^signBit)
	return binary.BigEndian.AppendUint64(dst, uint64(s.end)^signBit), nil
}

func (spanCodec) Decode(b []byte) (span, error) {
	if len(b) != 16 {
		return span{}, fmt.Errorf("%w: window of %d bytes, want 16", errDecode, len(b))
	}
	return decodeSpan(b), nil
}

func decodeSpan(b []byte) span {
	return span{
		start: int64(binary.BigEndian.Uint64(b) ^ signBit),
		end:   int64(binary.BigEndian.Uint64(b[8:]) ^ signBit),
	}
}

func (spanCodec) ID() string { return "window-span-v1" }

// elemKey is the state key of one record of a window's full contents.
type elemKey struct {
	w   span
	seq uint64
}

// elemKeyCodec encodes an elemKey as the span's encoding | seq (8 bytes
// big-endian), so that a window's records are contiguous and in order.
type elemKeyCodec struct{}

func (elemKeyCodec) Append(dst []byte, k elemKey) ([]byte, error) {
	dst, _ = spanCodec{}.Append(dst, k.w)
	return binary.BigEndian.AppendUint64(dst, k.seq), nil
}

func (elemKeyCodec) Decode(b []byte) (elemKey, error) {
	if len(b) != 24 {
		return elemKey{}, fmt.Errorf("%w: element key of %d bytes, want 24", errDecode, len(b))
	}
	return elemKey{w: decodeSpan(b), seq: binary.BigEndian.Uint64(b[16:])}, nil
}

func (elemKeyCodec) ID() string { return "window-elem-v1" }

// accEntry is a window's accumulator with the number of times it fired.
type accEntry[ACC any] struct {
	fired uint32
	acc   ACC
}

// accEntryCodec encodes an accEntry as uvarint(fired) | accumulator.
type accEntryCodec[ACC any] struct{ c pipeline.Codec[ACC] }

func (c accEntryCodec[ACC]) Append(dst []byte, e accEntry[ACC]) ([]byte, error) {
	return c.c.Append(binary.AppendUvarint(dst, uint64(e.fired)), e.acc)
}

func (c accEntryCodec[ACC]) Decode(b []byte) (accEntry[ACC], error) {
	f, n := binary.Uvarint(b)
	if n <= 0 || f > math.MaxUint32 {
		return accEntry[ACC]{}, fmt.Errorf("%w: accumulator entry header", errDecode)
	}
	acc, err := c.c.Decode(b[n:])
	if err != nil {
		return accEntry[ACC]{}, err
	}
	return accEntry[ACC]{fired: uint32(f), acc: acc}, nil
}

func (c accEntryCodec[ACC]) ID() string { return "window-acc-v1(" + c.c.ID() + ")" }

// contentsMeta describes a window's full contents: the number of times it
// fired and the next record sequence number (records are [0, next) minus
// none: sequence numbers are dense).
type contentsMeta struct {
	fired uint32
	next  uint64
}

// metaCodec encodes contentsMeta as uvarint(fired) | uvarint(next).
type metaCodec struct{}

func (metaCodec) Append(dst []byte, m contentsMeta) ([]byte, error) {
	return binary.AppendUvarint(binary.AppendUvarint(dst, uint64(m.fired)), m.next), nil
}

func (metaCodec) Decode(b []byte) (contentsMeta, error) {
	f, n := binary.Uvarint(b)
	if n <= 0 || f > math.MaxUint32 {
		return contentsMeta{}, fmt.Errorf("%w: contents header", errDecode)
	}
	next, m := binary.Uvarint(b[n:])
	if m <= 0 || n+m != len(b) {
		return contentsMeta{}, fmt.Errorf("%w: contents header", errDecode)
	}
	return contentsMeta{fired: uint32(f), next: next}, nil
}

func (metaCodec) ID() string { return "window-meta-v1" }

// sessionsCodec encodes a key's session windows as (actual, state) span
// pairs, 32 bytes each.
type sessionsCodec struct{}

func (sessionsCodec) Append(dst []byte, ss []session) ([]byte, error) {
	for _, s := range ss {
		dst, _ = spanCodec{}.Append(dst, s.actual)
		dst, _ = spanCodec{}.Append(dst, s.state)
	}
	return dst, nil
}

func (sessionsCodec) Decode(b []byte) ([]session, error) {
	if len(b)%32 != 0 {
		return nil, fmt.Errorf("%w: session list of %d bytes", errDecode, len(b))
	}
	ss := make([]session, len(b)/32)
	for i := range ss {
		ss[i] = session{actual: decodeSpan(b[32*i:]), state: decodeSpan(b[32*i+16:])}
	}
	return ss, nil
}

func (sessionsCodec) ID() string { return "window-sessions-v1" }

// bytesCodec stores trigger state as it is (Decode copies).
type bytesCodec struct{}

func (bytesCodec) Append(dst []byte, b []byte) ([]byte, error) { return append(dst, b...), nil }

func (bytesCodec) Decode(b []byte) ([]byte, error) { return append([]byte(nil), b...), nil }

func (bytesCodec) ID() string { return "bytes" }
