package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"net/netip"
	"slices"
	"unsafe"
)

// Magic codes of stored records (protocol §4.1).
const (
	// MessageMagicV1 marks a record with a 1-byte topic length.
	MessageMagicV1 uint32 = 0xDAA320A7
	// MessageMagicV2 marks a record with a 2-byte topic length.
	MessageMagicV2 uint32 = 0xDAA320AB
	// MessageMagicBlank marks end-of-file padding in a commit log; it is never
	// a message.
	MessageMagicBlank uint32 = 0xCBD43194
)

// Fixed byte positions inside a stored record, for patching a record in place
// (a broker assigns offsets and timestamps after encoding). Positions after
// the born host depend on the host widths; use RecordStoreTimestampPos and
// RecordStoreHostPos.
const (
	RecordTotalSizePos      = 0  // int32 TOTALSIZE
	RecordMagicPos          = 4  // uint32 MAGICCODE
	RecordBodyCRCPos        = 8  // int32 BODYCRC
	RecordQueueIDPos        = 12 // int32 QUEUEID
	RecordFlagPos           = 16 // int32 FLAG
	RecordQueueOffsetPos    = 20 // int64 QUEUEOFFSET
	RecordPhysicalOffsetPos = 28 // int64 PHYSICALOFFSET
	RecordSysFlagPos        = 36 // int32 SYSFLAG
	RecordBornTimestampPos  = 40 // int64 BORNTIMESTAMP
	RecordBornHostPos       = 48 // BORNHOST (8 or 20 bytes)

	// RecordMinSize is the size of a V1 record with IPv4 hosts and an empty
	// body, topic and properties.
	RecordMinSize = 91

	// MaxTopicLengthV1 is the longest topic a V1 record holds; longer topics
	// need V2.
	MaxTopicLengthV1 = 127
	// MaxTopicLength is the longest topic any record can hold (int16 length).
	MaxTopicLength = math.MaxInt16
)

// RecordStoreTimestampPos returns the position of STORETIMESTAMP in a record
// with the given SYSFLAG (56 with an IPv4 born host, 68 with IPv6).
func RecordStoreTimestampPos(sysFlag int32) int {
	return RecordBornHostPos + hostWidth(sysFlag&SysFlagBornHostV6 != 0)
}

// RecordStoreHostPos returns the position of STOREHOST in a record with the
// given SYSFLAG.
func RecordStoreHostPos(sysFlag int32) int { return RecordStoreTimestampPos(sysFlag) + 8 }

func hostWidth(v6 bool) int {
	if v6 {
		return 20
	}
	return 8
}

var (
	// ErrRecordInvalid reports a stored record that cannot be decoded or
	// encoded: truncated, inconsistent lengths, unknown magic, out-of-range
	// values. The wrapping error names the field.
	ErrRecordInvalid = errors.New("protocol: invalid message record")
	// ErrRecordBlank reports the commit log's BLANK magic (end-of-file
	// padding) where a message was expected. It wraps ErrRecordInvalid.
	ErrRecordBlank = fmt.Errorf("%w: blank magic (commit log padding)", ErrRecordInvalid)
)

// BodyCRC returns Java's UtilAll.crc32 of b: CRC-32 (IEEE) masked with
// 0x7FFFFFFF. It is the BODYCRC of a record and the bodyCrc32 of
// REGISTER_BROKER.
func BodyCRC(b []byte) int32 { return int32(crc32.ChecksumIEEE(b) & 0x7FFFFFFF) }

// Message is a message as a producer builds it: what a send request carries.
// Properties is the raw properties string (§4.2); build it with AppendProperty
// or SetProperty. A Message is plain data, not safe for concurrent mutation.
type Message struct {
	Topic      string
	Flag       int32
	Body       []byte
	Properties string
}

// Property returns the value of a property of m.
func (m *Message) Property(key string) (string, bool) { return PropertyValue(m.Properties, key) }

// SetProperty sets property key to value, replacing any previous value. It
// rebuilds the properties string (one allocation).
func (m *Message) SetProperty(key, value string) {
	b := AppendPropertiesExcept(make([]byte, 0, len(m.Properties)+len(key)+len(value)+2), m.Properties, key)
	m.Properties = string(AppendProperty(b, key, value))
}

// Tags returns the TAGS property of m ("" when absent).
func (m *Message) Tags() string { v, _ := m.Property(PropTags); return v }

// MessageExt is one stored message record (protocol §4.1): what PULL,
// VIEW_MESSAGE_BY_ID, QUERY_MESSAGE, CHECK_TRANSACTION_STATE and
// CONSUME_MESSAGE_DIRECTLY bodies carry.
//
// A MessageExt returned by DecodeRecord or DecodeRecords ALIASES the buffer it
// was decoded from: Body is a sub-slice and Topic and Properties are strings
// sharing its memory. The buffer must not be modified while the MessageExt (or
// any string taken from it) is in use; call Clone to keep a message beyond the
// buffer's lifetime. A MessageExt is plain data, not safe for concurrent
// mutation.
type MessageExt struct {
	StoreSize                 int32 // TOTALSIZE (set by decoding; ignored by AppendRecord)
	BodyCRC                   int32 // BODYCRC (set by decoding; recomputed by AppendRecord)
	QueueID                   int32
	Flag                      int32
	QueueOffset               int64
	CommitLogOffset           int64 // PHYSICALOFFSET
	SysFlag                   int32
	BornTimestamp             int64 // ms
	BornHost                  netip.AddrPort
	StoreTimestamp            int64 // ms
	StoreHost                 netip.AddrPort
	ReconsumeTimes            int32
	PreparedTransactionOffset int64
	Body                      []byte // as stored: compressed if SysFlag&SysFlagCompressed
	Topic                     string
	Properties                string // raw properties string (§4.2)
}

// Property returns the value of a property of m without allocating.
func (m *MessageExt) Property(key string) (string, bool) { return PropertyValue(m.Properties, key) }

// Tags returns the TAGS property ("" when absent).
func (m *MessageExt) Tags() string { v, _ := m.Property(PropTags); return v }

// Keys returns the raw KEYS property: space-separated business keys.
func (m *MessageExt) Keys() string { v, _ := m.Property(PropKeys); return v }

// UniqKey returns the UNIQ_KEY property ("" when absent).
func (m *MessageExt) UniqKey() string { v, _ := m.Property(PropUniqKey); return v }

// OffsetMsgID returns the offset message id of m (§4.5), built from
// StoreHost and CommitLogOffset.
func (m *MessageExt) OffsetMsgID() string {
	var buf [56]byte
	return string(AppendOffsetMsgID(buf[:0], m.StoreHost, m.CommitLogOffset))
}

// MsgID returns the id clients show as "MsgId": UNIQ_KEY when present, else
// the offset message id.
func (m *MessageExt) MsgID() string {
	if k := m.UniqKey(); k != "" {
		return k
	}
	return m.OffsetMsgID()
}

// Compressed reports whether the body is compressed (SysFlagCompressed).
func (m *MessageExt) Compressed() bool { return m.SysFlag&SysFlagCompressed != 0 }

// DecompressedBody returns the body, decompressed when SysFlag says so,
// producing at most maxSize bytes (see DecompressBody).
func (m *MessageExt) DecompressedBody(maxSize int) ([]byte, error) {
	return DecompressBody(m.SysFlag, m.Body, maxSize)
}

// Clone returns a deep copy of m that shares no memory with the buffer m was
// decoded from.
func (m *MessageExt) Clone() MessageExt {
	c := *m
	c.Body = slices.Clone(m.Body)
	// Topic and Properties are copied into one allocation.
	s := string(append([]byte(m.Topic), m.Properties...))
	c.Topic, c.Properties = s[:len(m.Topic)], s[len(m.Topic):]
	return c
}

// RecordSize returns the encoded size of m and the magic AppendRecord would
// use, or an error when m cannot be encoded.
func (m *MessageExt) RecordSize() (int, uint32, error) {
	if len(m.Topic) > MaxTopicLength {
		return 0, 0, fmt.Errorf("%w: topic length %d exceeds %d", ErrRecordInvalid, len(m.Topic), MaxTopicLength)
	}
	if len(m.Properties) > MaxPropertiesLength {
		return 0, 0, fmt.Errorf("%w: properties length %d exceeds %d", ErrRecordInvalid, len(m.Properties), MaxPropertiesLength)
	}
	magic, n := MessageMagicV1, RecordMinSize
	if len(m.Topic) > MaxTopicLengthV1 {
		magic, n = MessageMagicV2, n+1
	}
	if hostIs6(m.BornHost) {
		n += 12
	}
	if hostIs6(m.StoreHost) {
		n += 12
	}
	n += len(m.Topic) + len(m.Properties)
	if len(m.Body) > math.MaxInt32-n {
		return 0, 0, fmt.Errorf("%w: body length %d too large", ErrRecordInvalid, len(m.Body))
	}
	return n + len(m.Body), magic, nil
}

func hostIs6(ap netip.AddrPort) bool {
	a := ap.Addr()
	return a.Is6() && !a.Is4In6()
}

// appendHost writes ip (4 or 16 bytes) and the port as int32. An invalid
// (zero) address is written as 0.0.0.0.
func appendHost(dst []byte, ap netip.AddrPort) []byte {
	a := ap.Addr().Unmap()
	if a.Is6() {
		b := a.As16()
		dst = append(dst, b[:]...)
	} else {
		var b [4]byte
		if a.Is4() {
			b = a.As4()
		}
		dst = append(dst, b[:]...)
	}
	return binary.BigEndian.AppendUint32(dst, uint32(ap.Port()))
}

// AppendRecord appends m encoded as a stored record to dst. It uses magic V1
// when the topic is at most 127 bytes and V2 otherwise, computes TOTALSIZE
// and BODYCRC (over Body as given, i.e. as stored), and sets or clears
// SysFlagBornHostV6 and SysFlagStoreHostV6 from the addresses (IPv4-mapped
// IPv6 addresses are written as IPv4). m.StoreSize and m.BodyCRC are ignored
// and not modified. It does not allocate when dst has room. The error
// (wrapping ErrRecordInvalid) reports a topic, properties or body too long
// for the format; dst is then returned unchanged.
func (m *MessageExt) AppendRecord(dst []byte) ([]byte, error) {
	size, magic, err := m.RecordSize()
	if err != nil {
		return dst, err
	}
	sysFlag := m.SysFlag &^ (SysFlagBornHostV6 | SysFlagStoreHostV6)
	if hostIs6(m.BornHost) {
		sysFlag |= SysFlagBornHostV6
	}
	if hostIs6(m.StoreHost) {
		sysFlag |= SysFlagStoreHostV6
	}
	dst = slices.Grow(dst, size)
	be := binary.BigEndian
	dst = be.AppendUint32(dst, uint32(size))
	dst = be.AppendUint32(dst, magic)
	dst = be.AppendUint32(dst, uint32(BodyCRC(m.Body)))
	dst = be.AppendUint32(dst, uint32(m.QueueID))
	dst = be.AppendUint32(dst, uint32(m.Flag))
	dst = be.AppendUint64(dst, uint64(m.QueueOffset))
	dst = be.AppendUint64(dst, uint64(m.CommitLogOffset))
	dst = be.AppendUint32(dst, uint32(sysFlag))
	dst = be.AppendUint64(dst, uint64(m.BornTimestamp))
	dst = appendHost(dst, m.BornHost)
	dst = be.AppendUint64(dst, uint64(m.StoreTimestamp))
	dst = appendHost(dst, m.StoreHost)
	dst = be.AppendUint32(dst, uint32(m.ReconsumeTimes))
	dst = be.AppendUint64(dst, uint64(m.PreparedTransactionOffset))
	dst = be.AppendUint32(dst, uint32(len(m.Body)))
	dst = append(dst, m.Body...)
	if magic == MessageMagicV1 {
		dst = append(dst, byte(len(m.Topic)))
	} else {
		dst = be.AppendUint16(dst, uint16(len(m.Topic)))
	}
	dst = append(dst, m.Topic...)
	dst = be.AppendUint16(dst, uint16(len(m.Properties)))
	return append(dst, m.Properties...), nil
}

// recReader is a sticky big-endian reader: after the first short read every
// read returns zero and bad stays set; check it once at the end.
type recReader struct {
	b   []byte
	off int
	bad bool
}

func (r *recReader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b)-r.off {
		r.bad = true
		return nil
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s
}

func (r *recReader) u8() uint8 {
	if s := r.take(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *recReader) u16() uint16 {
	if s := r.take(2); s != nil {
		return binary.BigEndian.Uint16(s)
	}
	return 0
}

func (r *recReader) u32() uint32 {
	if s := r.take(4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *recReader) u64() uint64 {
	if s := r.take(8); s != nil {
		return binary.BigEndian.Uint64(s)
	}
	return 0
}

func (r *recReader) host(v6 bool) (netip.AddrPort, bool) {
	var a netip.Addr
	if v6 {
		s := r.take(16)
		if s == nil {
			return netip.AddrPort{}, true
		}
		a = netip.AddrFrom16([16]byte(s))
	} else {
		s := r.take(4)
		if s == nil {
			return netip.AddrPort{}, true
		}
		a = netip.AddrFrom4([4]byte(s))
	}
	port := int32(r.u32())
	if port < 0 || port > math.MaxUint16 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a, uint16(port)), true
}

// msgAlias returns b as a string sharing its memory (no copy).
func msgAlias(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// DecodeRecord decodes the stored record at the start of b and returns it and
// its length n (= TOTALSIZE). The result aliases b (see MessageExt). Both
// magics are accepted; every length is checked against TOTALSIZE and the
// bytes remaining, and TOTALSIZE must equal the sum of the fields. Errors wrap
// ErrRecordInvalid (ErrRecordBlank for commit log padding). It never panics
// and does not allocate on success.
func DecodeRecord(b []byte) (MessageExt, int, error) {
	var m MessageExt
	n, err := decodeRecordInto(&m, b)
	return m, n, err
}

func decodeRecordInto(m *MessageExt, b []byte) (int, error) {
	if len(b) < 8 {
		return 0, fmt.Errorf("%w: %d bytes, need at least 8 for size and magic", ErrRecordInvalid, len(b))
	}
	size := int32(binary.BigEndian.Uint32(b))
	magic := binary.BigEndian.Uint32(b[4:])
	switch magic {
	case MessageMagicV1, MessageMagicV2:
	case MessageMagicBlank:
		return 0, ErrRecordBlank
	default:
		return 0, fmt.Errorf("%w: unknown magic 0x%08X", ErrRecordInvalid, magic)
	}
	if size < RecordMinSize || int64(size) > int64(len(b)) {
		return 0, fmt.Errorf("%w: TOTALSIZE %d outside [%d, %d available]", ErrRecordInvalid, size, RecordMinSize, len(b))
	}
	r := recReader{b: b[:size], off: 8}
	*m = MessageExt{StoreSize: size}
	m.BodyCRC = int32(r.u32())
	m.QueueID = int32(r.u32())
	m.Flag = int32(r.u32())
	m.QueueOffset = int64(r.u64())
	m.CommitLogOffset = int64(r.u64())
	m.SysFlag = int32(r.u32())
	m.BornTimestamp = int64(r.u64())
	var okPort bool
	if m.BornHost, okPort = r.host(m.SysFlag&SysFlagBornHostV6 != 0); !okPort {
		return 0, fmt.Errorf("%w: born host port out of range", ErrRecordInvalid)
	}
	m.StoreTimestamp = int64(r.u64())
	if m.StoreHost, okPort = r.host(m.SysFlag&SysFlagStoreHostV6 != 0); !okPort {
		return 0, fmt.Errorf("%w: store host port out of range", ErrRecordInvalid)
	}
	m.ReconsumeTimes = int32(r.u32())
	m.PreparedTransactionOffset = int64(r.u64())
	bodyLen := int32(r.u32())
	if bodyLen < 0 {
		return 0, fmt.Errorf("%w: negative body length %d", ErrRecordInvalid, bodyLen)
	}
	m.Body = r.take(int(bodyLen))
	if r.bad {
		return 0, fmt.Errorf("%w: body length %d exceeds TOTALSIZE %d", ErrRecordInvalid, bodyLen, size)
	}
	if len(m.Body) == 0 {
		m.Body = nil
	}
	var topicLen int
	if magic == MessageMagicV1 {
		topicLen = int(r.u8())
	} else {
		topicLen = int(int16(r.u16()))
	}
	if topicLen < 0 {
		return 0, fmt.Errorf("%w: negative topic length %d", ErrRecordInvalid, topicLen)
	}
	m.Topic = msgAlias(r.take(topicLen))
	propsLen := int(int16(r.u16()))
	if propsLen < 0 {
		return 0, fmt.Errorf("%w: negative properties length %d", ErrRecordInvalid, propsLen)
	}
	m.Properties = msgAlias(r.take(propsLen))
	if r.bad {
		return 0, fmt.Errorf("%w: topic (%d) or properties (%d) length exceeds TOTALSIZE %d", ErrRecordInvalid, topicLen, propsLen, size)
	}
	if r.off != int(size) {
		return 0, fmt.Errorf("%w: TOTALSIZE %d but fields end at %d", ErrRecordInvalid, size, r.off)
	}
	return int(size), nil
}

// DecodeRecords decodes the concatenated records of b (a PULL_MESSAGE body)
// and calls fn for each, in order, until fn returns false or b is exhausted.
// The *MessageExt passed to fn is reused for the next record and aliases b:
// copy (Clone) what must outlive the call. Decoding stops at the first invalid
// record, whose error is returned (records before it were delivered). It does
// not allocate per record.
func DecodeRecords(b []byte, fn func(*MessageExt) bool) error {
	var m MessageExt
	for off := 0; off < len(b); {
		n, err := decodeRecordInto(&m, b[off:])
		if err != nil {
			return fmt.Errorf("record at byte %d: %w", off, err)
		}
		off += n
		if !fn(&m) {
			return nil
		}
	}
	return nil
}
