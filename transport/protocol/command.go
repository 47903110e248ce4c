package protocol

import "strconv"

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

// inlineExt is the number of extFields a Command holds without a second
// allocation. Send and pull headers, the hottest ones, have at most 15.
const inlineExt = 16

// Command is one RocketMQ RemotingCommand: a request or a response.
//
// A Command returned by DecodeFrame aliases the frame buffer it was decoded
// from (Remark, extFields and Body point into it); the buffer must not be
// modified while the Command is in use. A Command is not safe for concurrent
// mutation; it may be read from several goroutines once built. A Command must
// not be copied by value once it has extFields: the copy would share the
// original's inline field storage.
type Command struct {
	Code     int32 // request code, or response code in a response (0 = success)
	Language LanguageCode
	Version  int32 // MQVersion ordinal of the sender
	Opaque   int32 // request id, echoed by the response
	Flag     int32 // FlagResponse, FlagOneway
	Remark   string
	Body     []byte

	ext    []ExtField
	inline [inlineExt]ExtField
	// arena holds the text of numbers set with SetExtInt. It only grows:
	// strings handed out alias it and must never change.
	arena []byte
}

// NewRequest returns a request command with the given code. The language and
// version are filled in by the transport that sends it when left zero.
func NewRequest(code int32) *Command {
	return &Command{Code: code}
}

// NewResponse returns a response to req with the given code and remark: the
// response flag set and req's opaque echoed.
func NewResponse(req *Command, code int32, remark string) *Command {
	return &Command{Code: code, Opaque: req.Opaque, Flag: FlagResponse, Remark: remark}
}

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
func (c *Command) NumExt() int { return len(c.ext) }

// ExtAt returns the i-th extField, in wire order.
func (c *Command) ExtAt(i int) ExtField { return c.ext[i] }

// Ext returns the value of extField key. If a decoded header repeated the key,
// the last value wins, as it does in Java's HashMap.
func (c *Command) Ext(key string) (string, bool) {
	for i := len(c.ext) - 1; i >= 0; i-- {
		if c.ext[i].Key == key {
			return c.ext[i].Value, true
		}
	}
	return "", false
}

// SetExt sets extField key to value, replacing an earlier value (the last one,
// should the key be repeated).
func (c *Command) SetExt(key, value string) {
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
func (c *Command) appendExt(key, value string) {
	if c.ext == nil {
		c.ext = c.inline[:0]
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
	clear(c.ext)
	c.ext = c.ext[:0]
}
