package rocketmq

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/runnel-dev/runnel/source"
)

// offsetVersion is the first byte of an encoded Offset.
const offsetVersion = 1

// encodedOffsetLen is the length of an encoded Offset: version, Next, End.
const encodedOffsetLen = 1 + 8 + 8

// Offset is a split's position as checkpoints store it.
type Offset struct {
	// Next is the queue offset of the next message to read.
	Next int64
	// End is the stop offset fixed for the split (exclusive), or -1 when the
	// split has no stop offset.
	End int64
}

// AppendTo appends the encoding of o to dst: a version byte (1), then Next
// and End as 8-byte big-endian integers.
func (o Offset) AppendTo(dst []byte) []byte {
	dst = append(dst, offsetVersion)
	dst = binary.BigEndian.AppendUint64(dst, uint64(o.Next))
	return binary.BigEndian.AppendUint64(dst, uint64(o.End))
}

// String describes o as `runnel checkpoint inspect` and the status page
// show it: "next 405", or "next 405 (stop at 500)" with a stop offset.
func (o Offset) String() string {
	if o.End >= 0 {
		return fmt.Sprintf("next %d (stop at %d)", o.Next, o.End)
	}
	return fmt.Sprintf("next %d", o.Next)
}

// DecodeOffset decodes an Offset encoded by AppendTo (what the source's
// SplitReader.Offset and Record.Offset hold). Errors wrap
// source.ErrBadOffset; it never panics.
func DecodeOffset(b []byte) (Offset, error) {
	if len(b) != encodedOffsetLen {
		return Offset{}, fmt.Errorf("%w: rocketmq offset of %d bytes, want %d", source.ErrBadOffset, len(b), encodedOffsetLen)
	}
	if b[0] != offsetVersion {
		return Offset{}, fmt.Errorf("%w: rocketmq offset version %d, want %d", source.ErrBadOffset, b[0], offsetVersion)
	}
	o := Offset{Next: int64(binary.BigEndian.Uint64(b[1:])), End: int64(binary.BigEndian.Uint64(b[9:]))}
	if o.Next < 0 || o.End < -1 {
		return Offset{}, fmt.Errorf("%w: rocketmq offset next=%d end=%d", source.ErrBadOffset, o.Next, o.End)
	}
	return o, nil
}

// splitID is the split ID of a queue: "brokerName/queueId".
func splitID(brokerName string, queueID int32) string {
	return brokerName + "/" + strconv.FormatInt(int64(queueID), 10)
}

// parseSplitID is the inverse of splitID.
func parseSplitID(id string) (brokerName string, queueID int32, err error) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return "", 0, fmt.Errorf("%w: split %q is not brokerName/queueId", ErrInvalidSplit, id)
	}
	n, err := strconv.ParseInt(id[i+1:], 10, 32)
	if err != nil || n < 0 {
		return "", 0, fmt.Errorf("%w: split %q: bad queue id", ErrInvalidSplit, id)
	}
	return id[:i], int32(n), nil
}
