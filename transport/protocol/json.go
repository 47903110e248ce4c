package protocol

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// maxJSONDepth bounds the nesting of a JSON header: the header object is
// level 1, extFields level 2; unknown fields may nest up to this level.
const maxJSONDepth = 32

// appendJSONHeader appends c's header in RocketMQ's JSON encoding (serialize
// type 0), compact, in the field order rocketmq-client-go writes:
//
//	{"code":…,"language":"GO","version":…,"opaque":…,"flag":…,"remark":"…","extFields":{…}}
//
// remark and extFields are always present ("" and {} when empty); extFields
// appear in c's order and every value is a JSON string. language is the Java
// enum name, or the bare number for a code Java does not define (fastjson
// reads enum ordinals too). The informational serializeTypeCurrentRPC field
// Java adds is not written: every receiver ignores it, and leaving it out
// keeps runnel's frames byte-identical to the Go client's.
//
// Strings are escaped as JSON requires: '"' and '\' with a backslash, and
// every byte below 0x20 as \u00XX (so property separators 0x01 and 0x02
// become \u0001 and \u0002). Other bytes, including invalid UTF-8, are
// written as they are.
func (c *Command) appendJSONHeader(dst []byte) []byte {
	dst = append(dst, `{"code":`...)
	dst = strconv.AppendInt(dst, int64(c.Code), 10)
	dst = append(dst, `,"language":`...)
	if c.Language.Known() {
		dst = append(dst, '"')
		dst = append(dst, languageNames[c.Language]...)
		dst = append(dst, '"')
	} else {
		dst = strconv.AppendUint(dst, uint64(c.Language), 10)
	}
	dst = append(dst, `,"version":`...)
	dst = strconv.AppendInt(dst, int64(c.Version), 10)
	dst = append(dst, `,"opaque":`...)
	dst = strconv.AppendInt(dst, int64(c.Opaque), 10)
	dst = append(dst, `,"flag":`...)
	dst = strconv.AppendInt(dst, int64(c.Flag), 10)
	dst = append(dst, `,"remark":`...)
	dst = appendJSONString(dst, c.Remark)
	dst = append(dst, `,"extFields":{`...)
	first := true
	for it := c.exts(); it.next(); {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, it.f.Key)
		dst = append(dst, ':')
		dst = appendJSONString(dst, it.f.Value)
	}
	return append(dst, "}}"...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a quoted JSON string (see appendJSONHeader).
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	run := 0 // start of the pending run of bytes that need no escape
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= 0x20 && ch != '"' && ch != '\\' {
			continue
		}
		dst = append(dst, s[run:i]...)
		switch ch {
		case '"', '\\':
			dst = append(dst, '\\', ch)
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[ch>>4], hexDigits[ch&0xF])
		}
		run = i + 1
	}
	dst = append(dst, s[run:]...)
	return append(dst, '"')
}

// jsonDecoder is a strict, allocation-free JSON scanner over one header. It
// unescapes strings in place inside b.
type jsonDecoder struct {
	b []byte
	p int
}

// decodeJSONHeader decodes a JSON header that fills h exactly. It is as
// tolerant as the Java and Go decoders where they are tolerant, and strict
// where JSON is:
//
//   - members may come in any order; unknown members are skipped (nested
//     objects and arrays included, validated, to maxJSONDepth levels);
//     remark, extFields and every other member may be missing or null; a
//     repeated member replaces the earlier one;
//   - code, version, opaque and flag are JSON integers within int32;
//   - language is the Java enum name (an unknown name decodes as
//     LanguageOther) or a number from 0 to 255;
//   - extFields values should be strings; a number, true or false is taken
//     as its literal text, and a null entry is dropped (Java skips null
//     values); objects and arrays are rejected; at most MaxExtFields
//     entries; duplicate keys are kept in order (Command.Ext reads the
//     last, as Java's HashMap would hold);
//   - strings are fully unescaped, \uXXXX surrogate pairs included (a lone
//     surrogate becomes U+FFFD), in place: the result is never longer than
//     its escaped form. Raw control characters are rejected; other bytes
//     are not checked for valid UTF-8.
//
// Anything else — invalid JSON, trailing bytes, a non-integer or
// out-of-range number — is an error wrapping ErrMalformedFrame.
func (c *Command) decodeJSONHeader(h []byte) error {
	d := jsonDecoder{b: h}
	d.skipWS()
	if !d.consume('{') {
		return d.errorf("header is not a JSON object")
	}
	d.skipWS()
	if d.consume('}') {
		return d.end()
	}
	for {
		d.skipWS()
		if !d.at('"') {
			return d.errorf("expected a member name")
		}
		key, err := d.readString()
		if err != nil {
			return err
		}
		d.skipWS()
		if !d.consume(':') {
			return d.errorf("expected ':' after %q", key)
		}
		d.skipWS()
		switch key {
		case "code":
			c.Code, err = d.readInt32OrNull(key)
		case "version":
			c.Version, err = d.readInt32OrNull(key)
		case "opaque":
			c.Opaque, err = d.readInt32OrNull(key)
		case "flag":
			c.Flag, err = d.readInt32OrNull(key)
		case "language":
			err = d.readLanguage(c)
		case "remark":
			switch {
			case d.at('"'):
				c.Remark, err = d.readString()
			case d.consumeLiteral("null"):
				c.Remark = ""
			default:
				err = d.errorf("remark is not a string")
			}
		case "extFields":
			err = d.readExtFields(c)
		default:
			err = d.skipValue(2)
		}
		if err != nil {
			return err
		}
		d.skipWS()
		if d.consume(',') {
			continue
		}
		if d.consume('}') {
			return d.end()
		}
		return d.errorf("expected ',' or '}' in header object")
	}
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return malformed("JSON header at byte %d: "+format, append([]any{d.p}, args...)...)
}

// end checks that only whitespace follows the header object.
func (d *jsonDecoder) end() error {
	d.skipWS()
	if d.p != len(d.b) {
		return d.errorf("trailing bytes after the header object")
	}
	return nil
}

func (d *jsonDecoder) skipWS() {
	for d.p < len(d.b) {
		switch d.b[d.p] {
		case ' ', '\t', '\n', '\r':
			d.p++
		default:
			return
		}
	}
}

func (d *jsonDecoder) at(ch byte) bool { return d.p < len(d.b) && d.b[d.p] == ch }

func (d *jsonDecoder) consume(ch byte) bool {
	if d.at(ch) {
		d.p++
		return true
	}
	return false
}

func (d *jsonDecoder) consumeLiteral(lit string) bool {
	if len(d.b)-d.p >= len(lit) && string(d.b[d.p:d.p+len(lit)]) == lit {
		d.p += len(lit)
		return true
	}
	return false
}

// readString reads the string starting at the '"' under the cursor and
// returns it unescaped, aliasing b.
func (d *jsonDecoder) readString() (string, error) {
	start := d.p + 1
	for i := start; i < len(d.b); i++ {
		switch ch := d.b[i]; {
		case ch == '"':
			d.p = i + 1
			return aliasString(d.b[start:i]), nil
		case ch == '\\':
			return d.readEscapedString(start, i)
		case ch < 0x20:
			d.p = i
			return "", d.errorf("control character 0x%02x in string", ch)
		}
	}
	d.p = len(d.b)
	return "", d.errorf("unterminated string")
}

// readEscapedString continues readString from the first backslash at r,
// compacting the unescaped string in place so that it starts at start.
func (d *jsonDecoder) readEscapedString(start, r int) (string, error) {
	b := d.b
	w := r
	for r < len(b) {
		ch := b[r]
		switch {
		case ch == '"':
			d.p = r + 1
			return aliasString(b[start:w]), nil
		case ch < 0x20:
			d.p = r
			return "", d.errorf("control character 0x%02x in string", ch)
		case ch != '\\':
			b[w] = ch
			w++
			r++
			continue
		}
		if r+1 >= len(b) {
			break
		}
		var out byte
		switch b[r+1] {
		case '"', '\\', '/':
			out = b[r+1]
		case 'b':
			out = '\b'
		case 'f':
			out = '\f'
		case 'n':
			out = '\n'
		case 'r':
			out = '\r'
		case 't':
			out = '\t'
		case 'u':
			u, ok := hex4(b, r+2)
			if !ok {
				d.p = r
				return "", d.errorf("bad \\u escape")
			}
			r += 6
			rn := rune(u)
			if utf16IsSurrogate(rn) {
				rn = utf8.RuneError
				if u < 0xDC00 && r+1 < len(b) && b[r] == '\\' && b[r+1] == 'u' {
					if lo, ok := hex4(b, r+2); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						rn = 0x10000 + (rune(u)-0xD800)<<10 + (rune(lo) - 0xDC00)
						r += 6
					}
				}
			}
			// w+len(encoding) <= r: an escape is never shorter than its UTF-8.
			w += utf8.EncodeRune(b[w:], rn)
			continue
		default:
			d.p = r
			return "", d.errorf("bad escape \\%c", b[r+1])
		}
		b[w] = out
		w++
		r += 2
	}
	d.p = len(b)
	return "", d.errorf("unterminated string")
}

func utf16IsSurrogate(r rune) bool { return r >= 0xD800 && r <= 0xDFFF }

// hex4 parses the 4 hex digits at b[i:i+4].
func hex4(b []byte, i int) (uint16, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var v uint16
	for _, ch := range b[i : i+4] {
		switch {
		case ch >= '0' && ch <= '9':
			ch -= '0'
		case ch >= 'a' && ch <= 'f':
			ch -= 'a' - 10
		case ch >= 'A' && ch <= 'F':
			ch -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(ch)
	}
	return v, true
}

// readInt32OrNull reads a JSON integer within int32, or null as 0.
func (d *jsonDecoder) readInt32OrNull(key string) (int32, error) {
	if d.consumeLiteral("null") {
		return 0, nil
	}
	v, err := d.readInt32()
	if err != nil {
		return 0, d.errorf("%s: %w", key, err)
	}
	return v, nil
}

// errJSONNumber values are wrapped by readInt32OrNull's errorf.
type jsonNumberError string

func (e jsonNumberError) Error() string { return string(e) }

// readInt32 reads a JSON integer (no fraction, no exponent) within int32.
func (d *jsonDecoder) readInt32() (int32, error) {
	b, p := d.b, d.p
	neg := p < len(b) && b[p] == '-'
	if neg {
		p++
	}
	if p >= len(b) || b[p] < '0' || b[p] > '9' {
		return 0, jsonNumberError("not a number")
	}
	var v int64
	if b[p] == '0' {
		p++
	} else {
		for ; p < len(b) && b[p] >= '0' && b[p] <= '9'; p++ {
			v = v*10 + int64(b[p]-'0')
			if v > 1<<31 {
				return 0, jsonNumberError("number out of int32 range")
			}
		}
	}
	if p < len(b) && (b[p] == '.' || b[p] == 'e' || b[p] == 'E') {
		return 0, jsonNumberError("not an integer")
	}
	if neg {
		v = -v
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, jsonNumberError("number out of int32 range")
	}
	d.p = p
	return int32(v), nil
}

// readNumberText validates a JSON number and returns its text, aliasing b.
func (d *jsonDecoder) readNumberText() (string, error) {
	b, p := d.b, d.p
	start := p
	if p < len(b) && b[p] == '-' {
		p++
	}
	digits := func() bool {
		s := p
		for p < len(b) && b[p] >= '0' && b[p] <= '9' {
			p++
		}
		return p > s
	}
	switch {
	case p < len(b) && b[p] == '0':
		p++
	case !digits():
		return "", d.errorf("bad number")
	}
	if p < len(b) && b[p] == '.' {
		p++
		if !digits() {
			return "", d.errorf("bad number fraction")
		}
	}
	if p < len(b) && (b[p] == 'e' || b[p] == 'E') {
		p++
		if p < len(b) && (b[p] == '+' || b[p] == '-') {
			p++
		}
		if !digits() {
			return "", d.errorf("bad number exponent")
		}
	}
	d.p = p
	return aliasString(b[start:p]), nil
}

// readLanguage reads the language member: a Java enum name, a number from
// 0 to 255, or null (left as is).
func (d *jsonDecoder) readLanguage(c *Command) error {
	switch {
	case d.at('"'):
		name, err := d.readString()
		if err != nil {
			return err
		}
		c.Language, _ = ParseLanguage(name)
		return nil
	case d.consumeLiteral("null"):
		return nil
	}
	v, err := d.readInt32()
	if err != nil {
		return d.errorf("language: %w", err)
	}
	if v < 0 || v > math.MaxUint8 {
		return d.errorf("language code %d out of range", v)
	}
	c.Language = LanguageCode(v)
	return nil
}

// readExtFields reads the extFields member: an object or null. A repeated
// extFields member replaces the earlier one.
func (d *jsonDecoder) readExtFields(c *Command) error {
	c.ResetExt()
	if d.consumeLiteral("null") {
		return nil
	}
	if !d.consume('{') {
		return d.errorf("extFields is not an object")
	}
	d.skipWS()
	if d.consume('}') {
		return nil
	}
	for {
		d.skipWS()
		if !d.at('"') {
			return d.errorf("expected an extFields key")
		}
		key, err := d.readString()
		if err != nil {
			return err
		}
		d.skipWS()
		if !d.consume(':') {
			return d.errorf("expected ':' after extFields key")
		}
		d.skipWS()
		var val string
		keep := true
		switch {
		case d.at('"'):
			val, err = d.readString()
		case d.consumeLiteral("null"):
			keep = false
		case d.consumeLiteral("true"):
			val = "true"
		case d.consumeLiteral("false"):
			val = "false"
		default:
			val, err = d.readNumberText()
			if err != nil {
				err = d.errorf("extFields value of %q is not a string, number or boolean", key)
			}
		}
		if err != nil {
			return err
		}
		if keep {
			if len(c.ext) == MaxExtFields {
				return d.errorf("more than %d extFields", MaxExtFields)
			}
			c.appendExt(key, val)
		}
		d.skipWS()
		if d.consume(',') {
			continue
		}
		if d.consume('}') {
			return nil
		}
		return d.errorf("expected ',' or '}' in extFields")
	}
}

// skipValue validates and skips one JSON value at nesting level depth.
func (d *jsonDecoder) skipValue(depth int) error {
	if d.p >= len(d.b) {
		return d.errorf("missing value")
	}
	switch ch := d.b[d.p]; {
	case ch == '"':
		_, err := d.readString()
		return err
	case ch == '{' || ch == '[':
		if depth > maxJSONDepth {
			return d.errorf("nesting deeper than %d levels", maxJSONDepth)
		}
		return d.skipContainer(depth + 1)
	case ch == 't':
		if d.consumeLiteral("true") {
			return nil
		}
	case ch == 'f':
		if d.consumeLiteral("false") {
			return nil
		}
	case ch == 'n':
		if d.consumeLiteral("null") {
			return nil
		}
	default:
		_, err := d.readNumberText()
		return err
	}
	return d.errorf("invalid literal")
}

// skipContainer skips the object or array under the cursor, whose members
// are at nesting level depth.
func (d *jsonDecoder) skipContainer(depth int) error {
	obj := d.b[d.p] == '{'
	closer := byte(']')
	if obj {
		closer = '}'
	}
	d.p++
	d.skipWS()
	if d.consume(closer) {
		return nil
	}
	for {
		d.skipWS()
		if obj {
			if !d.at('"') {
				return d.errorf("expected a member name")
			}
			if _, err := d.readString(); err != nil {
				return err
			}
			d.skipWS()
			if !d.consume(':') {
				return d.errorf("expected ':'")
			}
			d.skipWS()
		}
		if err := d.skipValue(depth); err != nil {
			return err
		}
		d.skipWS()
		if d.consume(',') {
			continue
		}
		if d.consume(closer) {
			return nil
		}
		return d.errorf("expected ',' or '%c'", closer)
	}
}
