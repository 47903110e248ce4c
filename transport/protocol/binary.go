package protocol

import (
	"encoding/binary"
	"fmt"
	"math"
)

// binaryFixedLen is the size of the fixed part of a ROCKETMQ binary header:
// code(2) language(1) version(2) opaque(4) flag(4) remarkLen(4) extLen(4).
const binaryFixedLen = 21

// appendBinaryHeader appends c's header in the ROCKETMQ binary encoding
// (serialize type 1), byte-compatible with Java's RocketMQSerializable:
//
//	code int16 | language uint8 | version int16 | opaque int32 | flag int32 |
//	remarkLen int32 | remark | extLen int32 | { keyLen int16 | key | valLen int32 | val }
//
// An empty remark is written with length 0, as Java writes a null or empty
// one. An empty extField value is written with length 0 too, as Java's
// encoder writes an empty (non-null) string; Java 4.9.4 and later read it
// back as null, the same as an absent key for every header decoder, while
// 4.9.3 and earlier read "" (see binary_java_test.go). extFields are
// written in c's order.
func (c *Command) appendBinaryHeader(dst []byte) ([]byte, error) {
	if c.Code < math.MinInt16 || c.Code > math.MaxInt16 {
		return dst, fmt.Errorf("%w: code %d does not fit the int16 of a ROCKETMQ header", ErrUnencodable, c.Code)
	}
	if c.Version < math.MinInt16 || c.Version > math.MaxInt16 {
		return dst, fmt.Errorf("%w: version %d does not fit the int16 of a ROCKETMQ header", ErrUnencodable, c.Version)
	}
	if len(c.Remark) > math.MaxInt32 {
		return dst, fmt.Errorf("%w: remark of %d bytes", ErrFrameTooLarge, len(c.Remark))
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(int16(c.Code)))
	dst = append(dst, byte(c.Language))
	dst = binary.BigEndian.AppendUint16(dst, uint16(int16(c.Version)))
	dst = binary.BigEndian.AppendUint32(dst, uint32(c.Opaque))
	dst = binary.BigEndian.AppendUint32(dst, uint32(c.Flag))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(c.Remark)))
	dst = append(dst, c.Remark...)
	extAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	if c.rawN > 0 {
		// Unsplit fields of a decoded binary header: already in this layout.
		dst = append(dst, c.raw()...)
	}
	for i := range c.ext {
		f := &c.ext[i]
		if len(f.Key) > math.MaxInt16 {
			return dst, fmt.Errorf("%w: extField key of %d bytes does not fit an int16 length", ErrUnencodable, len(f.Key))
		}
		if len(f.Value) > math.MaxInt32 {
			return dst, fmt.Errorf("%w: extField value of %d bytes", ErrFrameTooLarge, len(f.Value))
		}
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(f.Key)))
		dst = append(dst, f.Key...)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(f.Value)))
		dst = append(dst, f.Value...)
	}
	extLen := len(dst) - extAt - 4
	if extLen > math.MaxInt32 {
		return dst, fmt.Errorf("%w: extFields of %d bytes", ErrFrameTooLarge, extLen)
	}
	binary.BigEndian.PutUint32(dst[extAt:], uint32(extLen))
	return dst, nil
}

// decodeBinaryHeader decodes a ROCKETMQ binary header that fills h exactly.
// Every length is checked against the bytes that remain before use; a
// negative length, a length running past h, trailing bytes after the
// extFields section or more than MaxExtFields entries is an error wrapping
// ErrMalformedFrame. Strings alias h. A zero-length remark decodes as "", and
// a zero-length extField value as a present "": what the JSON encoding
// carries for an empty string, where Java 4.9.4+ (RocketMQSerializable.readStr)
// yields null, as for an absent key. A required field sent empty thus
// satisfies runnel's header decoders but is null to a Java one (which only
// logs it).
//
// A section of at most lazyMaxExt valid entries is kept unsplit
// (see Command); a longer one is split into c.ext at once.
func (c *Command) decodeBinaryHeader(h []byte) error {
	if len(h) < binaryFixedLen {
		return malformed("ROCKETMQ header of %d bytes is shorter than its %d-byte fixed part", len(h), binaryFixedLen)
	}
	c.Code = int32(int16(binary.BigEndian.Uint16(h[0:])))
	c.Language = LanguageCode(h[2])
	c.Version = int32(int16(binary.BigEndian.Uint16(h[3:])))
	c.Opaque = int32(binary.BigEndian.Uint32(h[5:]))
	c.Flag = int32(binary.BigEndian.Uint32(h[9:]))
	rl := int64(int32(binary.BigEndian.Uint32(h[13:])))
	p := 17
	// 4 bytes of extLen must follow the remark.
	if rl < 0 || rl > int64(len(h)-p-4) {
		return malformed("ROCKETMQ header remark length %d does not fit the %d header bytes left", rl, len(h)-p-4)
	}
	c.Remark = aliasString(h[p : p+int(rl)])
	p += int(rl)
	el := int64(int32(binary.BigEndian.Uint32(h[p:])))
	p += 4
	if el != int64(len(h)-p) {
		return malformed("ROCKETMQ header extFields length %d, but %d header bytes are left", el, len(h)-p)
	}
	c.ResetExt()
	// Validate every entry (walking by reslicing, so the compiler can drop
	// most bounds checks) and count them.
	n := 0
	for rest := h[p:]; len(rest) > 0; n++ {
		if n == MaxExtFields {
			return malformed("more than %d extFields", MaxExtFields)
		}
		if len(rest) < 6 { // key length + value length
			return malformed("extField truncated: %d bytes left", len(rest))
		}
		kl := int(int16(binary.BigEndian.Uint16(rest)))
		if kl < 0 || kl > len(rest)-6 {
			return malformed("extField key length %d does not fit the %d header bytes left", kl, len(rest)-6)
		}
		key := rest[2 : 2+kl]
		rest = rest[2+kl:]
		vl := int(int32(binary.BigEndian.Uint32(rest)))
		rest = rest[4:]
		if vl < 0 || vl > len(rest) {
			return malformed("extField %q value length %d does not fit the %d header bytes left", key, vl, len(rest))
		}
		rest = rest[vl:]
	}
	if n == 0 {
		return nil
	}
	c.setRaw(h[p:], n)
	if n > lazyMaxExt {
		c.split()
	}
	return nil
}
