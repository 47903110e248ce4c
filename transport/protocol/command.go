package protocol

import (
	"strconv"
	"unsafe"
)

// SerializeType is the header encoding of one frame: the high byte of the
// header-length word.
type SerializeType uint8

const (
	// SerializeJSON is RocketMQ's JSON header encoding (serialize type 0).
	SerializeJSON SerializeType = 0
	// SerializeRocketMQ is RocketMQ's compact binary header encoding (type 1).
	SerializeRocketMQ SerializeType = 1
)

// Flag bits of a RemotingCommand.
const (
	// FlagResponse marks a frame as a response (bit 0).
	FlagResponse int32 = 1 << 0
	// FlagOneway marks a request that expects no response (bit 1).
	FlagOneway int32 = 1 << 1
)

// ExtField is one entry of a command's extFields ("custom header"). Every
// value is a string on the wire, whatever its Java type.
type ExtField struct {
	Key, Value string
}

// inlineExt is the number of extFields a Command built by NewRequest or
// decoded from a JSON header holds without a second allocation. Send and pull
// headers, the hottest ones, have at most 15.
const inlineExt = 16

// inlineRespExt is the same for NewResponse: responses carry fewer fields (a
// send response about 7).
const inlineRespExt = 8

// inlineRespArena is the arena (see Command.arena) a Command built by
// NewResponse holds without another allocation: a send response's queue
// offset and IPv4 message id, or a pull response's three offsets, fit.
const inlineRespArena = 64

// lazyMaxExt is the most extFields a decoded ROCKETMQ binary header keeps
// unsplit (see Command.rawN); a header with more is split at once, so that
// ExtAt, which walks an unsplit section, stays cheap.
const lazyMaxExt = 16

// Command is one RocketMQ RemotingCommand: a request or a response.
//
// A Command returned by DecodeFrame aliases the frame buffer it was decoded
// from (Remark, extFields and Body point into it); the buffer must not be
// modified while the Command is in use. A Command is not safe for concurrent
// mutation; it may be read from several goroutines once built (reading never
// changes it). A Command must not be copied by value once it has extFields:
// the copy would share the original's field storage.
type Command struct {
	Code     int32 // request code, or response code in a response (0 = success)
	Version  int32 // MQVersion ordinal of the sender
	Opaque   int32 // request id, echoed by the response
	Flag     int32 // FlagResponse, FlagOneway
	Language LanguageCode
	// rawN, rawLen and rawPtr, when rawN > 0, hold the extFields instead of
	// ext: the validated extFields section of a decoded ROCKETMQ binary
	// header (rawLen bytes at rawPtr, aliasing the frame; see raw), rawN
	// entries, split into ext only when the Command is mutated. Lookups and
	// iteration read it in place, so decoding a binary frame costs one
	// small allocation, whatever its header holds. ext is then empty. A
	// pointer and a length rather than a string keep Command at 120 bytes,
	// so that with 16 inline extFields it stays in the 640-byte size class.
	rawN uint8 // <= lazyMaxExt
	// st is the header encoding of the frame the Command was decoded
	// from (SerializeJSON for one built locally); see SerializeType.
	st     SerializeType
	rawLen uint32
	Remark string
	Body   []byte

	ext    []ExtField
	rawPtr *byte
	// arena holds the text of numbers set with SetExtInt. It only grows:
	// strings handed out alias it and must never change.
	arena []byte
}

// raw returns the unsplit extFields section (see Command.rawN).
func (c *Command) raw() string { return unsafe.String(c.rawPtr, c.rawLen) }

// setRaw keeps the validated section b of n entries unsplit.
func (c *Command) setRaw(b []byte, n int) {
	c.rawPtr, c.rawLen, c.rawN = unsafe.SliceData(b), uint32(len(b)), uint8(n)
}

// clearRaw forgets the unsplit section.
func (c *Command) clearRaw() { c.rawPtr, c.rawLen, c.rawN = nil, 0, 0 }

// commandExt is a Command allocated together with storage for inlineExt
// extFields; commandRespExt with inlineRespExt and an inlineRespArena-byte
// arena (448 bytes in all).
type (
	commandExt struct {
		Command
		buf [inlineExt]ExtField
	}
	commandRespExt struct {
		Command
		buf   [inlineRespExt]ExtField
		arena [inlineRespArena]byte
	}
)

// newCommand returns a zero Command with room for inlineExt extFields, in
// one allocation.
func newCommand() *Command {
	ce := new(commandExt)
	ce.ext = ce.buf[:0]
	return &ce.Command
}

// NewRequest returns a request command with the given code. The language and
// version are filled in by the transport that sends it when left zero.
func NewRequest(code int32) *Command {
	c := newCommand()
	c.Code = code
	return c
}

// NewResponse returns a response to req with the given code and remark: the
// response flag set and req's opaque echoed.
func NewResponse(req *Command, code int32, remark string) *Command {
	ce := new(commandRespExt)
	c := &ce.Command
	c.ext = ce.buf[:0]
	c.arena = ce.arena[:0]
	c.Code, c.Opaque, c.Flag, c.Remark = code, req.Opaque, FlagResponse, remark
	return c
}

// SerializeType returns the header encoding of the frame c was decoded
// from; SerializeJSON for a Command built by NewRequest or NewResponse. A
// RocketMQ peer decodes either encoding on every frame, so a server may
// answer each request in the encoding the request came in.
func (c *Command) SerializeType() SerializeType { return c.st }

// IsResponse reports whether the response bit is set.
func (c *Command) IsResponse() bool { return c.Flag&FlagResponse != 0 }

// IsOneway reports whether the one-way bit is set. Note that
// rocketmq-client-go never sets it on its "one-way" requests.
func (c *Command) IsOneway() bool { return c.Flag&FlagOneway != 0 }

// MarkResponse sets the response bit.
func (c *Command) MarkResponse() { c.Flag |= FlagResponse }

// MarkOneway sets the one-way bit.
func (c *Command) MarkOneway() { c.Flag |= FlagOneway }

// NumExt returns the number of extFields.
func (c *Command) NumExt() int {
	if c.rawN > 0 {
		return int(c.rawN)
	}
	return len(c.ext)
}

// ExtAt returns the i-th extField, in wire order. It panics if i is out of
// range, as indexing does.
func (c *Command) ExtAt(i int) ExtField {
	if c.rawN == 0 {
		return c.ext[i]
	}
	if i < 0 || i >= int(c.rawN) {
		panic("protocol: ExtAt index " + strconv.Itoa(i) + " out of range [0:" + strconv.Itoa(int(c.rawN)) + "]")
	}
	raw := c.raw()
	var f ExtField
	for range i + 1 {
		f, raw = splitRawExt(raw)
	}
	return f
}

// Ext returns the value of extField key. If a decoded header repeated the key,
// the last value wins, as it does in Java's HashMap.
func (c *Command) Ext(key string) (string, bool) {
	if c.rawN > 0 {
		var (
			val   string
			found bool
		)
		for it := c.exts(); it.next(); {
			if it.f.Key == key {
				val, found = it.f.Value, true
			}
		}
		return val, found
	}
	for i := len(c.ext) - 1; i >= 0; i-- {
		if c.ext[i].Key == key {
			return c.ext[i].Value, true
		}
	}
	return "", false
}

// extIter walks a Command's extFields in wire order without changing it,
// whether they are split (ext) or not (Command.raw). Use:
//
//	for it := c.exts(); it.next(); { use(it.f) }
type extIter struct {
	ext []ExtField // split fields not yet visited
	raw string     // unsplit entries not yet visited
	f   ExtField   // the current field
}

// exts returns an iterator over c's extFields.
func (c *Command) exts() extIter {
	if c.rawN > 0 {
		return extIter{raw: c.raw()}
	}
	return extIter{ext: c.ext}
}

// next moves to the next field, reporting false at the end.
func (it *extIter) next() bool {
	if len(it.ext) > 0 {
		it.f = it.ext[0]
		it.ext = it.ext[1:]
		return true
	}
	if len(it.raw) == 0 {
		return false
	}
	it.f, it.raw = splitRawExt(it.raw)
	return true
}

// splitRawExt returns the first entry of a validated unsplit section and the
// rest: keyLen int16 | key | valLen int32 | val.
func splitRawExt(raw string) (ExtField, string) {
	kl := int(raw[0])<<8 | int(raw[1])
	key := raw[2 : 2+kl]
	raw = raw[2+kl:]
	vl := int(raw[0])<<24 | int(raw[1])<<16 | int(raw[2])<<8 | int(raw[3])
	return ExtField{Key: key, Value: raw[4 : 4+vl]}, raw[4+vl:]
}

// split moves unsplit extFields (Command.rawN) into ext, before a mutation.
func (c *Command) split() {
	if c.rawN == 0 {
		return
	}
	n := int(c.rawN)
	if cap(c.ext) < n {
		c.ext = make([]ExtField, 0, n+4)
	}
	for it := c.exts(); it.next(); {
		c.ext = append(c.ext, it.f)
	}
	c.clearRaw()
}

// SetExt sets extField key to value, replacing an earlier value (the last one,
// should the key be repeated).
func (c *Command) SetExt(key, value string) {
	c.split()
	for i := len(c.ext) - 1; i >= 0; i-- {
		if c.ext[i].Key == key {
			c.ext[i].Value = value
			return
		}
	}
	c.appendExt(key, value)
}

// appendExt adds a field without looking for an earlier one with the same
// key; decoders and generated encoders that know keys are unique use it.
// c must have no unsplit fields.
func (c *Command) appendExt(key, value string) {
	if cap(c.ext) == 0 {
		c.ext = make([]ExtField, 0, inlineRespExt)
	}
	c.ext = append(c.ext, ExtField{Key: key, Value: value})
}

// SetExtInt sets extField key to the decimal form of v. The text is kept in
// a per-Command arena, so setting many numbers costs about one allocation.
func (c *Command) SetExtInt(key string, v int64) {
	if v >= 0 && v < 100 {
		c.SetExt(key, strconv.FormatInt(v, 10)) // small numbers: no allocation
		return
	}
	if cap(c.arena)-len(c.arena) < 20 { // the longest int64 is 20 bytes
		c.arena = make([]byte, 0, 256)
	}
	start := len(c.arena)
	c.arena = strconv.AppendInt(c.arena, v, 10)
	c.SetExt(key, aliasString(c.arena[start:]))
}

// SetExtBytes sets extField key to a copy of v, kept in the arena like the
// numbers of SetExtInt, so that text built in a scratch buffer (a message
// id) costs no allocation of its own.
func (c *Command) SetExtBytes(key string, v []byte) {
	if cap(c.arena)-len(c.arena) < len(v) {
		c.arena = make([]byte, 0, max(256, len(v)))
	}
	start := len(c.arena)
	c.arena = append(c.arena, v...)
	c.SetExt(key, aliasString(c.arena[start:]))
}

// SetExtBool sets extField key to "true" or "false".
func (c *Command) SetExtBool(key string, v bool) { c.SetExt(key, strconv.FormatBool(v)) }

// DeleteExt removes every extField named key.
func (c *Command) DeleteExt(key string) {
	c.split()
	n := 0
	for i := range c.ext {
		if c.ext[i].Key != key {
			c.ext[n] = c.ext[i]
			n++
		}
	}
	clear(c.ext[n:])
	c.ext = c.ext[:n]
}

// ResetExt removes every extField.
func (c *Command) ResetExt() {
	c.clearRaw()
	clear(c.ext)
	c.ext = c.ext[:0]
}
