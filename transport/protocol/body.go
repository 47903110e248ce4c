package protocol

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON bodies (protocol §5). The Java side writes them with fastjson, whose
// default output is not always JSON: maps with integer keys are written with
// unquoted keys ({0:"a:1"}) and maps keyed by objects with the key object
// itself in key position ({{"brokerName":"b","queueId":0,"topic":"t"}:42}).
// Every Decode here first runs NormalizeJSON, which rewrites those forms into
// standard JSON, and then decodes with encoding/json (these bodies are not
// per-message hot paths). Encoders emit compact standard JSON with fastjson's
// alphabetical field order, except where a reader needs the fastjson
// object-key form (ResetOffsetBody, ConsumeStats, ConsumerRunningInfo).

// Limits applied by every body decoder.
const (
	// MaxBodySize is the largest JSON body Decode accepts (16 MiB, the
	// frame size limit).
	MaxBodySize = 16 << 20
	// MaxJSONDepth is the deepest nesting of objects and arrays accepted.
	MaxJSONDepth = 64
	// MaxJSONValues is the largest number of JSON values (scalars, objects,
	// arrays) one body may contain.
	MaxJSONValues = 4 << 20
)

var (
	// ErrBodyInvalid reports a JSON body that cannot be decoded (malformed,
	// wrong types, absurd sizes). The wrapping error says why.
	ErrBodyInvalid = errors.New("protocol: invalid JSON body")
	// ErrBodyTooLarge reports a body larger than MaxBodySize (or than the
	// limits MaxJSONDepth and MaxJSONValues). It wraps ErrBodyInvalid.
	ErrBodyTooLarge = fmt.Errorf("%w: too large", ErrBodyInvalid)
)

// NormalizeJSON appends to dst a compact, standard-JSON rewrite of src, which
// may use fastjson's non-standard forms: unquoted object keys made of
// letters, digits and "_$.+-" are quoted ({0:"a"} -> {"0":"a"}); an object or
// array in key position becomes a string holding its normalized JSON text
// ({{"a":1}:2} -> {"{\"a\":1}":2}). Whitespace outside strings is dropped.
// Strings are copied verbatim (escapes are checked by the later JSON decode);
// scalars must be JSON numbers or true, false, null.
//
// It rejects input nested deeper than MaxJSONDepth or holding more than
// MaxJSONValues values (ErrBodyTooLarge), and anything else malformed
// (ErrBodyInvalid). It never panics. Fuzz invariant: when it succeeds the
// output is valid JSON, and normalizing the output again is the identity.
func NormalizeJSON(dst, src []byte) ([]byte, error) {
	n := bodyNormalizer{src: src, out: dst}
	n.skipWS()
	if err := n.value(0); err != nil {
		return dst, err
	}
	n.skipWS()
	if n.pos != len(src) {
		return dst, n.errf("trailing data")
	}
	return n.out, nil
}

type bodyNormalizer struct {
	src    []byte
	pos    int
	out    []byte
	values int
}

func (n *bodyNormalizer) errf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrBodyInvalid, n.pos, fmt.Sprintf(format, args...))
}

func (n *bodyNormalizer) skipWS() {
	for n.pos < len(n.src) {
		switch n.src[n.pos] {
		case ' ', '\t', '\n', '\r':
			n.pos++
		default:
			return
		}
	}
}

func bodyBareKeyByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
		c == '_' || c == '$' || c == '.' || c == '+' || c == '-'
}

func (n *bodyNormalizer) value(depth int) error {
	if depth > MaxJSONDepth {
		return fmt.Errorf("%w: nested deeper than %d", ErrBodyTooLarge, MaxJSONDepth)
	}
	n.values++
	if n.values > MaxJSONValues {
		return fmt.Errorf("%w: more than %d values", ErrBodyTooLarge, MaxJSONValues)
	}
	if n.pos >= len(n.src) {
		return n.errf("unexpected end of input")
	}
	switch c := n.src[n.pos]; {
	case c == '{':
		return n.object(depth)
	case c == '[':
		return n.array(depth)
	case c == '"':
		return n.str()
	default:
		start := n.pos
		for n.pos < len(n.src) && bodyBareKeyByte(n.src[n.pos]) {
			n.pos++
		}
		tok := n.src[start:n.pos]
		if !bodyIsScalar(tok) {
			n.pos = start
			return n.errf("unexpected %q", bodyTok(n.src[start:]))
		}
		n.out = append(n.out, tok...)
		return nil
	}
}

func bodyTok(b []byte) []byte {
	if len(b) > 16 {
		return b[:16]
	}
	return b
}

// bodyIsScalar reports whether tok is true, false, null or a JSON number.
func bodyIsScalar(tok []byte) bool {
	switch string(tok) {
	case "true", "false", "null":
		return true
	case "":
		return false
	}
	i := 0
	if tok[i] == '-' {
		i++
	}
	digits := func() int {
		s := i
		for i < len(tok) && tok[i] >= '0' && tok[i] <= '9' {
			i++
		}
		return i - s
	}
	if i < len(tok) && tok[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(tok) && tok[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(tok) && (tok[i] == 'e' || tok[i] == 'E') {
		i++
		if i < len(tok) && (tok[i] == '+' || tok[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(tok)
}

// str copies a string token verbatim.
func (n *bodyNormalizer) str() error {
	start := n.pos
	n.pos++
	for n.pos < len(n.src) {
		switch n.src[n.pos] {
		case '\\':
			n.pos += 2
			continue
		case '"':
			n.pos++
			n.out = append(n.out, n.src[start:n.pos]...)
			return nil
		}
		n.pos++
	}
	n.pos = start
	return n.errf("unterminated string")
}

func (n *bodyNormalizer) object(depth int) error {
	n.pos++ // '{'
	n.out = append(n.out, '{')
	n.skipWS()
	if n.pos < len(n.src) && n.src[n.pos] == '}' {
		n.pos++
		n.out = append(n.out, '}')
		return nil
	}
	for {
		n.skipWS()
		if err := n.key(depth); err != nil {
			return err
		}
		n.skipWS()
		if n.pos >= len(n.src) || n.src[n.pos] != ':' {
			return n.errf("expected ':'")
		}
		n.pos++
		n.out = append(n.out, ':')
		n.skipWS()
		if err := n.value(depth + 1); err != nil {
			return err
		}
		n.skipWS()
		if n.pos >= len(n.src) {
			return n.errf("unterminated object")
		}
		switch n.src[n.pos] {
		case ',':
			n.pos++
			n.out = append(n.out, ',')
		case '}':
			n.pos++
			n.out = append(n.out, '}')
			return nil
		default:
			return n.errf("expected ',' or '}'")
		}
	}
}

func (n *bodyNormalizer) key(depth int) error {
	if n.pos >= len(n.src) {
		return n.errf("unexpected end of input")
	}
	switch c := n.src[n.pos]; {
	case c == '"':
		return n.str()
	case c == '{' || c == '[':
		// Normalize the key value on its own, then emit it as a string.
		sub := bodyNormalizer{src: n.src, pos: n.pos, values: n.values}
		if err := sub.value(depth + 1); err != nil {
			return err
		}
		n.pos, n.values = sub.pos, sub.values
		n.out = appendBodyString(n.out, msgAlias(sub.out))
		return nil
	case bodyBareKeyByte(c):
		start := n.pos
		for n.pos < len(n.src) && bodyBareKeyByte(n.src[n.pos]) {
			n.pos++
		}
		n.out = append(n.out, '"')
		n.out = append(n.out, n.src[start:n.pos]...)
		n.out = append(n.out, '"')
		return nil
	default:
		return n.errf("invalid object key")
	}
}

func (n *bodyNormalizer) array(depth int) error {
	n.pos++ // '['
	n.out = append(n.out, '[')
	n.skipWS()
	if n.pos < len(n.src) && n.src[n.pos] == ']' {
		n.pos++
		n.out = append(n.out, ']')
		return nil
	}
	for {
		n.skipWS()
		if err := n.value(depth + 1); err != nil {
			return err
		}
		n.skipWS()
		if n.pos >= len(n.src) {
			return n.errf("unterminated array")
		}
		switch n.src[n.pos] {
		case ',':
			n.pos++
			n.out = append(n.out, ',')
		case ']':
			n.pos++
			n.out = append(n.out, ']')
			return nil
		default:
			return n.errf("expected ',' or ']'")
		}
	}
}

// decodeBody checks the size of b, normalizes it and decodes it into v.
func decodeBody(what string, b []byte, v any) error {
	if len(b) > MaxBodySize {
		return fmt.Errorf("%w: %s body of %d bytes exceeds %d", ErrBodyTooLarge, what, len(b), MaxBodySize)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return fmt.Errorf("%w: empty %s body", ErrBodyInvalid, what)
	}
	norm, err := NormalizeJSON(make([]byte, 0, len(b)), b)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := json.Unmarshal(norm, v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBodyInvalid, what, err)
	}
	return nil
}

// encodeBody marshals v with encoding/json.
func encodeBody(what string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode %s: %w", what, err)
	}
	return b, nil
}

// appendBodyString appends s as a JSON string in fastjson's
// BrowserCompatible style: control characters and all non-ASCII characters
// escaped as \uXXXX (UTF-16), invalid UTF-8 as \ufffd.
func appendBodyString(dst []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	u := func(dst []byte, r rune) []byte {
		return append(dst, '\\', 'u', hexd[r>>12&0xF], hexd[r>>8&0xF], hexd[r>>4&0xF], hexd[r&0xF])
	}
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20 || c == 0x7F:
				dst = u(dst, rune(c))
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			dst = u(u(dst, r1), r2)
		} else {
			dst = u(dst, r)
		}
	}
	return append(dst, '"')
}

// MessageQueue identifies one queue of a topic on one broker. Its JSON form
// is {"brokerName":…,"queueId":…,"topic":…}.
type MessageQueue struct {
	BrokerName string `json:"brokerName"`
	QueueID    int32  `json:"queueId"`
	Topic      string `json:"topic"`
}

// Compare orders queues by topic, broker name, then queue id.
func (q MessageQueue) Compare(o MessageQueue) int {
	return cmp.Or(cmp.Compare(q.Topic, o.Topic), cmp.Compare(q.BrokerName, o.BrokerName), cmp.Compare(q.QueueID, o.QueueID))
}

// String returns "topic@brokerName:queueId" for logs.
func (q MessageQueue) String() string {
	return q.Topic + "@" + q.BrokerName + ":" + strconv.Itoa(int(q.QueueID))
}

func appendMessageQueue(dst []byte, q MessageQueue) []byte {
	dst = append(dst, `{"brokerName":`...)
	dst = appendBodyString(dst, q.BrokerName)
	dst = append(dst, `,"queueId":`...)
	dst = strconv.AppendInt(dst, int64(q.QueueID), 10)
	dst = append(dst, `,"topic":`...)
	dst = appendBodyString(dst, q.Topic)
	return append(dst, '}')
}

// appendMQMap appends m in fastjson's object-key form
// {{mq}:value,…}, with keys sorted by MessageQueue.Compare.
func appendMQMap[V any](dst []byte, m map[MessageQueue]V, appendValue func([]byte, V) ([]byte, error)) ([]byte, error) {
	keys := make([]MessageQueue, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, MessageQueue.Compare)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendMessageQueue(dst, k)
		dst = append(dst, ':')
		var err error
		if dst, err = appendValue(dst, m[k]); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

func appendBodyValue[V any](dst []byte, v V) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode: %w", err)
	}
	return append(dst, b...), nil
}

// decodeMQMap decodes a normalized map keyed by MessageQueue: either an
// object whose keys are MessageQueue JSON texts (the normalized fastjson
// form), or Gson's array of [queue, value] pairs. null or absent gives nil.
func decodeMQMap[V any](what string, raw json.RawMessage) (map[MessageQueue]V, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	bad := func(err error) error { return fmt.Errorf("%w: %s: %w", ErrBodyInvalid, what, err) }
	if raw[0] == '[' {
		var pairs []json.RawMessage
		if err := json.Unmarshal(raw, &pairs); err != nil {
			return nil, bad(err)
		}
		m := make(map[MessageQueue]V, len(pairs))
		for _, p := range pairs {
			var kv []json.RawMessage
			if err := json.Unmarshal(p, &kv); err != nil {
				return nil, bad(err)
			}
			if len(kv) != 2 {
				return nil, bad(fmt.Errorf("map entry has %d elements, want 2", len(kv)))
			}
			var (
				q MessageQueue
				v V
			)
			if err := json.Unmarshal(kv[0], &q); err != nil {
				return nil, bad(err)
			}
			if err := json.Unmarshal(kv[1], &v); err != nil {
				return nil, bad(err)
			}
			m[q] = v
		}
		return m, nil
	}
	var obj map[string]V
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, bad(err)
	}
	m := make(map[MessageQueue]V, len(obj))
	for k, v := range obj {
		var q MessageQueue
		if err := json.Unmarshal([]byte(k), &q); err != nil {
			return nil, bad(fmt.Errorf("map key %q is not a message queue: %w", k, err))
		}
		m[q] = v
	}
	return m, nil
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
