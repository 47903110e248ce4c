package store

import (
	"encoding/binary"
	"fmt"
)

// Key space prefixes; see the package documentation for the layout.
const (
	prefixVersion  = 'v'
	prefixGlobal   = 'g'
	prefixMessage  = 'm'
	prefixQueue    = 'q'
	prefixPhys     = 'p'
	prefixKeyIndex = 'k'
	prefixOffset   = 'o'
	prefixTopicCfg = 't'
	prefixGroupCfg = 's'
	prefixMeta     = 'x'
	prefixEpoch    = 'e'
	prefixLogID    = 'l'
)

// formatVersion is the on-disk layout version written at creation.
const formatVersion = 1

// valueFixedHeader is tagsCode(8) + storeTimestamp(8).
const valueFixedHeader = 16

// physValueFixed is recordLen(4) + queueId(4) + offset(8).
const physValueFixed = 16

var (
	keyVersion = []byte{prefixVersion}
	keyGlobal  = []byte{prefixGlobal}
)

func appendString16(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// appendQueuePrefix appends prefix | topic | queueId.
func appendQueuePrefix(dst []byte, prefix byte, topic string, queue int32) []byte {
	dst = append(dst, prefix)
	dst = appendString16(dst, topic)
	return binary.BigEndian.AppendUint32(dst, uint32(queue))
}

func appendTopicPrefix(dst []byte, prefix byte, topic string) []byte {
	dst = append(dst, prefix)
	return appendString16(dst, topic)
}

func msgKeyLen(topic string) int { return 1 + 2 + len(topic) + 4 + 8 }

// putMsgKey writes the message key into dst, which must be msgKeyLen(topic) long.
func putMsgKey(dst []byte, topic string, queue int32, offset int64) {
	dst[0] = prefixMessage
	binary.BigEndian.PutUint16(dst[1:], uint16(len(topic)))
	n := 3 + copy(dst[3:], topic)
	binary.BigEndian.PutUint32(dst[n:], uint32(queue))
	binary.BigEndian.PutUint64(dst[n+4:], uint64(offset))
}

func appendMsgKey(dst []byte, topic string, queue int32, offset int64) []byte {
	dst = appendQueuePrefix(dst, prefixMessage, topic, queue)
	return binary.BigEndian.AppendUint64(dst, uint64(offset))
}

// parseQueueKey splits prefix | topic | queueId [| rest].
func parseQueueKey(k []byte) (topic string, queue int32, rest []byte, err error) {
	if len(k) < 3 {
		return "", 0, nil, errCorruptKey(k)
	}
	n := int(binary.BigEndian.Uint16(k[1:]))
	if len(k) < 3+n+4 {
		return "", 0, nil, errCorruptKey(k)
	}
	topic = string(k[3 : 3+n])
	queue = int32(binary.BigEndian.Uint32(k[3+n:]))
	return topic, queue, k[3+n+4:], nil
}

// msgKeyOffset returns the offset from a message key known to have the
// expected prefix length.
func msgKeyOffset(k []byte) int64 {
	return int64(binary.BigEndian.Uint64(k[len(k)-8:]))
}

func appendPhysKey(dst []byte, phys int64) []byte {
	dst = append(dst, prefixPhys)
	return binary.BigEndian.AppendUint64(dst, uint64(phys))
}

// tsKey maps an int64 timestamp to an order-preserving uint64.
func tsKey(ts int64) uint64 { return uint64(ts) ^ (1 << 63) }

func appendKeyIndexPrefix(dst []byte, topic, key string) []byte {
	dst = appendTopicPrefix(dst, prefixKeyIndex, topic)
	return appendString16(dst, key)
}

func keyIndexKeyLen(topic, key string) int { return 1 + 2 + len(topic) + 2 + len(key) + 16 }

func appendKeyIndexKey(dst []byte, topic, key string, ts, phys int64) []byte {
	dst = appendKeyIndexPrefix(dst, topic, key)
	dst = binary.BigEndian.AppendUint64(dst, tsKey(ts))
	return binary.BigEndian.AppendUint64(dst, uint64(phys))
}

func appendOffsetKey(dst []byte, group, topic string, queue int32) []byte {
	dst = appendTopicPrefix(dst, prefixOffset, topic)
	dst = appendString16(dst, group)
	return binary.BigEndian.AppendUint32(dst, uint32(queue))
}

func appendNameKey(dst []byte, prefix byte, name string) []byte {
	dst = append(dst, prefix)
	return append(dst, name...)
}

// prefixEnd returns the smallest key greater than every key with the given
// prefix, or nil if there is none (all 0xff).
func prefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// valueHeaderLen returns the encoded size of the value header for keys.
func valueHeaderLen(keys []string) (hdr int, keysLen int) {
	for _, k := range keys {
		keysLen += uvarintLen(uint64(len(k))) + len(k)
	}
	return valueFixedHeader + uvarintLen(uint64(keysLen)) + keysLen, keysLen
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// putValueHeader encodes the header into v and returns its length.
func putValueHeader(v []byte, tagsCode, storeTS int64, keys []string, keysLen int) int {
	binary.BigEndian.PutUint64(v[0:], uint64(tagsCode))
	binary.BigEndian.PutUint64(v[8:], uint64(storeTS))
	p := valueFixedHeader + binary.PutUvarint(v[valueFixedHeader:], uint64(keysLen))
	for _, k := range keys {
		p += binary.PutUvarint(v[p:], uint64(len(k)))
		p += copy(v[p:], k)
	}
	return p
}

// msgValue is a decoded message value; slices alias the stored bytes.
type msgValue struct {
	tagsCode int64
	storeTS  int64
	keys     []byte // sequence of uvarint(len) key
	rec      []byte
}

func decodeValue(v []byte) (msgValue, error) {
	var m msgValue
	if len(v) < valueFixedHeader+1 {
		return m, fmt.Errorf("%w: message value of %d bytes", ErrCorrupt, len(v))
	}
	m.tagsCode = int64(binary.BigEndian.Uint64(v[0:]))
	m.storeTS = int64(binary.BigEndian.Uint64(v[8:]))
	kl, n := binary.Uvarint(v[valueFixedHeader:])
	if n <= 0 || kl > uint64(len(v)) {
		return m, fmt.Errorf("%w: bad key list length", ErrCorrupt)
	}
	p := valueFixedHeader + n
	if uint64(len(v)-p) < kl {
		return m, fmt.Errorf("%w: key list overruns value", ErrCorrupt)
	}
	m.keys = v[p : p+int(kl)]
	m.rec = v[p+int(kl):]
	if len(m.rec) < minRecordLen || int64(binary.BigEndian.Uint32(m.rec)) != int64(len(m.rec)) {
		return m, fmt.Errorf("%w: stored record length mismatch", ErrCorrupt)
	}
	return m, nil
}

// recordPhys returns the physical offset patched into a stored record.
func recordPhys(rec []byte) int64 { return int64(binary.BigEndian.Uint64(rec[posPhysOffset:])) }

// forEachKey calls fn for every key in an encoded key list.
func forEachKey(keys []byte, fn func(k []byte)) error {
	for len(keys) > 0 {
		l, n := binary.Uvarint(keys)
		if n <= 0 || l > uint64(len(keys)-n) {
			return fmt.Errorf("%w: bad key in key list", ErrCorrupt)
		}
		fn(keys[n : n+int(l)])
		keys = keys[n+int(l):]
	}
	return nil
}

func errCorruptKey(k []byte) error {
	return fmt.Errorf("%w: malformed key %q", ErrCorrupt, k)
}

func decodeInt64(v []byte) (int64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: int64 value of %d bytes", ErrCorrupt, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// checkName validates a topic, group or key string used in keys.
func checkName(kind, s string, maxLen int) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalid, kind)
	}
	if len(s) > maxLen {
		return fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrInvalid, kind, len(s), maxLen)
	}
	return nil
}

func checkQueue(queue int32) error {
	if queue < 0 {
		return fmt.Errorf("%w: negative queue id %d", ErrInvalid, queue)
	}
	return nil
}
