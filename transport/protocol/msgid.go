package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"time"
)

// ErrMsgIDInvalid reports a message id that is not a valid offset message id.
var ErrMsgIDInvalid = errors.New("protocol: invalid offset message id")

const msgUpperHex = "0123456789ABCDEF"

// Lengths of offset message ids (§4.5).
const (
	OffsetMsgIDLenV4 = 32 // 4-byte IP + int32 port + int64 offset, hex
	OffsetMsgIDLenV6 = 56 // 16-byte IP + int32 port + int64 offset, hex
)

func msgAppendHex(dst, b []byte) []byte {
	for _, c := range b {
		dst = append(dst, msgUpperHex[c>>4], msgUpperHex[c&0xF])
	}
	return dst
}

// AppendOffsetMsgID appends the offset message id of a message stored at
// physical offset phys on storeHost: upper-case hex of IP (4 bytes, or 16 for
// an IPv6 address) + port (int32) + phys (int64), 32 or 56 characters.
// IPv4-mapped IPv6 addresses are written as IPv4; an invalid address as
// 0.0.0.0. It does not allocate when dst has room.
func AppendOffsetMsgID(dst []byte, storeHost netip.AddrPort, phys int64) []byte {
	var raw [28]byte
	b := appendHost(raw[:0], storeHost)
	b = binary.BigEndian.AppendUint64(b, uint64(phys))
	return msgAppendHex(dst, b)
}

// OffsetMsgID returns AppendOffsetMsgID as a string.
func OffsetMsgID(storeHost netip.AddrPort, phys int64) string {
	var buf [OffsetMsgIDLenV6]byte
	return string(AppendOffsetMsgID(buf[:0], storeHost, phys))
}

func msgUnhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// ParseOffsetMsgID decodes an offset message id (32 hex characters for an
// IPv4 store host, 56 for IPv6; either case) into the store host and the
// physical (commit log) offset. Errors wrap ErrMsgIDInvalid.
func ParseOffsetMsgID(s string) (netip.AddrPort, int64, error) {
	if len(s) != OffsetMsgIDLenV4 && len(s) != OffsetMsgIDLenV6 {
		return netip.AddrPort{}, 0, fmt.Errorf("%w: length %d, want %d or %d", ErrMsgIDInvalid, len(s), OffsetMsgIDLenV4, OffsetMsgIDLenV6)
	}
	var raw [28]byte
	b := raw[:len(s)/2]
	for i := range b {
		hi, ok1 := msgUnhex(s[2*i])
		lo, ok2 := msgUnhex(s[2*i+1])
		if !ok1 || !ok2 {
			return netip.AddrPort{}, 0, fmt.Errorf("%w: non-hex character at %d", ErrMsgIDInvalid, 2*i)
		}
		b[i] = hi<<4 | lo
	}
	var a netip.Addr
	ipLen := 4
	if len(b) == 28 {
		ipLen = 16
		a = netip.AddrFrom16([16]byte(b[:16]))
	} else {
		a = netip.AddrFrom4([4]byte(b[:4]))
	}
	port := int32(binary.BigEndian.Uint32(b[ipLen:]))
	if port < 0 || port > math.MaxUint16 {
		return netip.AddrPort{}, 0, fmt.Errorf("%w: port %d out of range", ErrMsgIDInvalid, port)
	}
	phys := int64(binary.BigEndian.Uint64(b[ipLen+4:]))
	return netip.AddrPortFrom(a, uint16(port)), phys, nil
}

// UniqIDGenerator creates unique client message ids (the UNIQ_KEY property)
// in the Java layout (MessageClientIDSetter): IP (4 bytes, or 16 for IPv6) +
// pid (int16) + a random int32 fixed per generator (Java uses a class-loader
// hash) + milliseconds since the start of the current month, UTC (int32) +
// a counter (int16), all upper-case hex: 32 characters for IPv4.
//
// A UniqIDGenerator is safe for concurrent use. Create one per client (it
// holds no global state).
type UniqIDGenerator struct {
	prefix    [2 * (16 + 2 + 4)]byte // hex of IP + pid + random
	prefixLen int
	counter   atomic.Uint32
	// month caches the current month's bounds; replaced (one allocation)
	// when the month changes.
	month atomic.Pointer[monthBounds]
}

// monthBounds is [start, next) of a UTC month in unix milliseconds.
type monthBounds struct{ start, next int64 }

// NewUniqIDGenerator returns a generator for a client on host ip with process
// id pid. An invalid ip is written as 0.0.0.0; IPv4-mapped addresses as IPv4.
func NewUniqIDGenerator(ip netip.Addr, pid int) *UniqIDGenerator {
	g := &UniqIDGenerator{}
	var raw [22]byte
	b := raw[:0]
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		a := ip.As4()
		b = append(b, a[:]...)
	case ip.Is6():
		a := ip.As16()
		b = append(b, a[:]...)
	default:
		b = append(b, 0, 0, 0, 0)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(pid))
	b = binary.BigEndian.AppendUint32(b, rand.Uint32())
	g.prefixLen = len(msgAppendHex(g.prefix[:0], b))
	g.counter.Store(rand.Uint32())
	return g
}

// Len returns the length of the ids g produces (32 for an IPv4 host, 56 for
// IPv6).
func (g *UniqIDGenerator) Len() int { return g.prefixLen + 12 }

// AppendNext appends a new id to dst. It does not allocate when dst has room.
func (g *UniqIDGenerator) AppendNext(dst []byte) []byte { return g.AppendNextAt(dst, time.Now()) }

// Next returns a new id as a string.
func (g *UniqIDGenerator) Next() string {
	var buf [56]byte
	return string(g.AppendNext(buf[:0]))
}

// AppendNextAt is AppendNext with an explicit clock reading (for tests and
// callers that already hold the time).
func (g *UniqIDGenerator) AppendNextAt(dst []byte, now time.Time) []byte {
	ms := now.UnixMilli()
	mb := g.month.Load()
	if mb == nil || ms < mb.start || ms >= mb.next {
		u := now.UTC()
		s := time.Date(u.Year(), u.Month(), 1, 0, 0, 0, 0, time.UTC)
		mb = &monthBounds{start: s.UnixMilli(), next: s.AddDate(0, 1, 0).UnixMilli()}
		g.month.Store(mb)
	}
	var raw [6]byte
	binary.BigEndian.PutUint32(raw[:], uint32(int32(ms-mb.start)))
	binary.BigEndian.PutUint16(raw[4:], uint16(g.counter.Add(1)))
	dst = append(dst, g.prefix[:g.prefixLen]...)
	return msgAppendHex(dst, raw[:])
}
