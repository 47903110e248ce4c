package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"unsafe"
)

// DefaultMaxFrameSize is the largest frame (the value of the leading length
// word) ReadFrame accepts when given a maxFrame <= 0: 16 MiB, the default of
// RocketMQ's com.rocketmq.remoting.frameMaxLength.
const DefaultMaxFrameSize = 16 << 20

// MaxHeaderLength is the largest header the 24-bit header-length field can
// describe.
const MaxHeaderLength = 1<<24 - 1

// MaxExtFields bounds the number of extFields a decoded header may carry.
// Real headers carry at most about twenty; the bound stops a small frame from
// making the decoder allocate a huge field table.
const MaxExtFields = 1024

var (
	// ErrMalformedFrame is wrapped by every error DecodeFrame and ReadFrame
	// return for bytes that are not a valid frame: bad lengths, an unknown
	// serialize type, a truncated or invalid header, bad JSON. A connection
	// that produced one should be closed, as Java does.
	ErrMalformedFrame = errors.New("protocol: malformed frame")

	// ErrFrameTooLarge is wrapped by the error ReadFrame returns for a length
	// word above its limit (that error also wraps ErrMalformedFrame), and by
	// the error AppendFrame returns for a header longer than MaxHeaderLength
	// or a frame longer than math.MaxInt32 bytes.
	ErrFrameTooLarge = errors.New("protocol: frame too large")

	// ErrUnencodable is wrapped by the error AppendFrame returns for a
	// Command the chosen header encoding cannot express: in a ROCKETMQ
	// binary header, a code or version outside int16 or an extField key
	// longer than 32767 bytes; an unknown serialize type.
	ErrUnencodable = errors.New("protocol: command not encodable")
)

// malformed returns an error wrapping ErrMalformedFrame.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformedFrame}, args...)...)
}

// AppendFrame appends c to dst as one complete frame — the 4-byte total
// length word, the header-length word whose high byte is st, the header in
// encoding st and c.Body — and returns the extended slice. It allocates only
// when dst lacks capacity, so encoding into a reused buffer costs nothing.
//
// On error dst is returned unextended. The error wraps ErrUnencodable when st
// is unknown or c does not fit st (a ROCKETMQ binary header holds code and
// version as int16, so POP codes such as 200050 need SerializeJSON), and
// ErrFrameTooLarge when the header exceeds MaxHeaderLength bytes or the frame
// exceeds math.MaxInt32 bytes.
//
// AppendFrame only reads c; it is safe to call concurrently on one Command.
func (c *Command) AppendFrame(dst []byte, st SerializeType) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	var err error
	switch st {
	case SerializeJSON:
		dst = c.appendJSONHeader(dst)
	case SerializeRocketMQ:
		dst, err = c.appendBinaryHeader(dst)
	default:
		err = fmt.Errorf("%w: unknown serialize type %d", ErrUnencodable, st)
	}
	if err != nil {
		return dst[:start], err
	}
	hl := len(dst) - start - 8
	if hl > MaxHeaderLength {
		return dst[:start], fmt.Errorf("%w: header of %d bytes exceeds %d", ErrFrameTooLarge, hl, MaxHeaderLength)
	}
	total := 4 + hl + len(c.Body)
	if total > math.MaxInt32 {
		return dst[:start], fmt.Errorf("%w: frame of %d bytes", ErrFrameTooLarge, total)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(total))
	binary.BigEndian.PutUint32(dst[start+4:], uint32(st)<<24|uint32(hl))
	return append(dst, c.Body...), nil
}

// DecodeFrame decodes one frame given without its leading 4-byte total-length
// word: b is the header-length word, the header and the body.
//
// The returned Command aliases b: Body is a sub-slice of b, and Remark and the
// extField strings point into b. A JSON header's escaped strings are unescaped
// in place inside b. b must therefore not be modified or reused while the
// Command is in use; on error its contents are unspecified.
//
// Every error wraps ErrMalformedFrame. DecodeFrame never panics, whatever b
// holds. Besides the frame buffer it allocates only the *Command: for a
// ROCKETMQ binary header a 128-byte one that reads the extFields in place
// from b (they are split into a table of their own only if the Command is
// mutated); for a JSON header one that holds up to 16 extFields inline.
func DecodeFrame(b []byte) (*Command, error) {
	var c *Command
	if len(b) > 0 && SerializeType(b[0]) == SerializeRocketMQ {
		c = new(Command)
	} else {
		c = newCommand()
	}
	if err := c.decodeFrame(b); err != nil {
		return nil, err
	}
	return c, nil
}

// DecodeFrameInto is DecodeFrame into c, which it resets first, keeping only
// c's extField storage: a Command reused this way decodes without
// allocating. Everything c held before (strings and slices it handed out
// included) must no longer be in use; afterwards c aliases b as DecodeFrame's
// result does. On error c holds an unspecified, but valid, partial decode.
func DecodeFrameInto(c *Command, b []byte) error {
	clear(c.ext)
	*c = Command{ext: c.ext[:0]}
	return c.decodeFrame(b)
}

// decodeFrame is DecodeFrame into a zero Command.
func (c *Command) decodeFrame(b []byte) error {
	if len(b) < 4 {
		return malformed("frame of %d bytes is shorter than its header-length word", len(b))
	}
	word := binary.BigEndian.Uint32(b)
	st := SerializeType(word >> 24)
	hl := int(word & MaxHeaderLength)
	if hl > len(b)-4 {
		return malformed("header length %d exceeds the %d bytes left in the frame", hl, len(b)-4)
	}
	header := b[4 : 4+hl : 4+hl]
	c.st = st
	var err error
	switch st {
	case SerializeJSON:
		err = c.decodeJSONHeader(header)
	case SerializeRocketMQ:
		err = c.decodeBinaryHeader(header)
	default:
		return malformed("unknown serialize type %d", st)
	}
	if err != nil {
		return err
	}
	if body := b[4+hl:]; len(body) > 0 {
		c.Body = body
	}
	return nil
}

// ReadFrame reads one frame from r: the 4-byte length word n, checked to be
// 4 <= n <= maxFrame before anything is allocated, then the n-byte frame,
// passed to DecodeFrame. maxFrame <= 0 means DefaultMaxFrameSize. The
// returned Command aliases the frame's buffer, which the caller then owns.
//
// A frame of up to eagerFrameSize bytes is read into one buffer of its
// size. A larger one is read into a buffer that starts at eagerFrameSize
// and doubles as bytes arrive, so that the memory a peer makes the reader
// hold stays within twice what it actually sent, whatever length it
// claims (a length word of 16 MiB followed by a trickle costs 64 KiB, not
// 16 MiB); a frame received in full costs at most one extra copy of
// itself.
//
// Errors: io.EOF when r ends cleanly before the first byte of a frame; an
// error wrapping io.ErrUnexpectedEOF when it ends inside one; r's own error
// otherwise; for a length word above maxFrame an error wrapping both
// ErrFrameTooLarge and ErrMalformedFrame; for a length below 4 (including
// "negative" words with the high bit set) an error wrapping ErrMalformedFrame;
// and DecodeFrame's errors. ReadFrame blocks as r does; cancellation is the
// caller's business (close the connection or set a deadline).
func ReadFrame(r io.Reader, maxFrame int) (*Command, error) {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrameSize
	}
	n, err := readLenWord(r)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("protocol: reading frame length: %w", err)
		}
		return nil, err
	}
	switch {
	case n < 0:
		return nil, malformed("negative frame length %d", n)
	case n < 4:
		return nil, malformed("frame length %d is shorter than the header-length word", n)
	case int64(n) > int64(maxFrame):
		return nil, fmt.Errorf("%w: %w: length %d exceeds the limit of %d bytes", ErrMalformedFrame, ErrFrameTooLarge, n, maxFrame)
	}
	buf, err := readFrameBody(r, int(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("protocol: reading %d-byte frame: %w", n, err)
	}
	return DecodeFrame(buf)
}

// eagerFrameSize is the largest frame ReadFrame allocates in full before
// its bytes arrive.
const eagerFrameSize = 64 << 10

// readFrameBody reads n bytes from r into a buffer that grows with what
// arrives (see ReadFrame).
func readFrameBody(r io.Reader, n int) ([]byte, error) {
	buf := make([]byte, 0, min(n, eagerFrameSize))
	for {
		m, err := io.ReadFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		switch {
		case err != nil:
			return nil, err
		case len(buf) == n:
			return buf, nil
		}
		grown := make([]byte, len(buf), min(n, 2*cap(buf)))
		copy(grown, buf)
		buf = grown
	}
}

// readLenWord reads a frame's 4-byte length word. From a *bufio.Reader (the
// transport's case) it peeks, sparing the escaping scratch array an
// io.Reader would need: one allocation less per frame.
func readLenWord(r io.Reader) (int32, error) {
	if br, ok := r.(*bufio.Reader); ok {
		w, err := br.Peek(4)
		if len(w) == 4 {
			n := int32(binary.BigEndian.Uint32(w))
			_, _ = br.Discard(4) // cannot fail: 4 bytes are buffered
			return n, nil
		}
		if err == nil || (errors.Is(err, io.EOF) && len(w) > 0) {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	var w [4]byte
	if _, err := io.ReadFull(r, w[:]); err != nil {
		return 0, err
	}
	return int32(binary.BigEndian.Uint32(w[:])), nil
}

// aliasString returns a string sharing b's memory, without copying. The
// caller guarantees b is not modified while the string is in use.
func aliasString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
