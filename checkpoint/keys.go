package checkpoint

import (
	"encoding/binary"
	"fmt"
)

// Key layout (see doc.go, "Key layout"). Every key starts with a one-byte
// family; families sort in this order.
const (
	famSystem  byte = 0x00 // format version, latest pointer, restore marker
	famMeta    byte = 0x01 // famMeta | id(8 BE) -> metadata JSON
	famOffset  byte = 0x02 // famOffset | SplitKey -> opaque offset
	famPending byte = 0x03 // famPending | uvarint len | sinkUID | subtask(4 BE) | id(8 BE) -> data
	famState   byte = 0x04 // famState | keyGroup(2 BE) | uidLen(2 BE) | uid | user key -> value
	famEnd     byte = 0x05 // first key past every family
)

var (
	keyFormat    = []byte{famSystem, 'f'}
	keyLatest    = []byte{famSystem, 'l'}
	keyRestoring = []byte{famSystem, 'r'}
)

// Bounds on what callers may store (checked before anything is written).
const (
	// MaxUIDLen bounds operator and sink UIDs.
	MaxUIDLen = 1024
	// MaxKeyLen bounds a state key (and a split key).
	MaxKeyLen = 64 << 10
	// MaxValueLen bounds a state value, an offset and pending-commit data.
	MaxValueLen = 32 << 20
)

func metaKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{famMeta}, id)
}

func offsetKey(split string) []byte {
	k := make([]byte, 0, 1+len(split))
	return append(append(k, famOffset), split...)
}

func pendingKey(p *PendingCommit) ([]byte, error) {
	if p.SinkUID == "" || len(p.SinkUID) > MaxUIDLen {
		return nil, fmt.Errorf("%w: sink UID length %d", ErrInvalid, len(p.SinkUID))
	}
	if p.Subtask < 0 || p.Subtask > 1<<31-1 {
		return nil, fmt.Errorf("%w: subtask %d", ErrInvalid, p.Subtask)
	}
	k := make([]byte, 0, 1+binary.MaxVarintLen16+len(p.SinkUID)+12)
	k = append(k, famPending)
	k = binary.AppendUvarint(k, uint64(len(p.SinkUID)))
	k = append(k, p.SinkUID...)
	k = binary.BigEndian.AppendUint32(k, uint32(p.Subtask))
	return binary.BigEndian.AppendUint64(k, p.CheckpointID), nil
}

func parsePendingKey(k []byte) (PendingCommit, error) {
	var p PendingCommit
	if len(k) < 1 || k[0] != famPending {
		return p, fmt.Errorf("%w: pending key family", ErrCorrupt)
	}
	n, w := binary.Uvarint(k[1:])
	if w <= 0 || n > MaxUIDLen || uint64(len(k)-1-w) != n+12 {
		return p, fmt.Errorf("%w: pending key of %d bytes", ErrCorrupt, len(k))
	}
	rest := k[1+w:]
	p.SinkUID = string(rest[:n])
	p.Subtask = int(binary.BigEndian.Uint32(rest[n:]))
	p.CheckpointID = binary.BigEndian.Uint64(rest[n+4:])
	return p, nil
}

// appendStatePrefix appends famState | keyGroup | uidLen | uid.
func appendStatePrefix(dst []byte, uid string, keyGroup uint16) []byte {
	dst = append(dst, famState)
	dst = binary.BigEndian.AppendUint16(dst, keyGroup)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(uid)))
	return append(dst, uid...)
}

func checkUID(uid string) error {
	if uid == "" || len(uid) > MaxUIDLen {
		return fmt.Errorf("%w: operator UID length %d (1..%d)", ErrInvalid, len(uid), MaxUIDLen)
	}
	return nil
}

// parseStateKey splits a famState key.
func parseStateKey(k []byte) (uid []byte, keyGroup uint16, key []byte, err error) {
	if len(k) < 5 || k[0] != famState {
		return nil, 0, nil, fmt.Errorf("%w: state key of %d bytes", ErrCorrupt, len(k))
	}
	keyGroup = binary.BigEndian.Uint16(k[1:])
	n := int(binary.BigEndian.Uint16(k[3:]))
	if len(k) < 5+n {
		return nil, 0, nil, fmt.Errorf("%w: state key uid length %d", ErrCorrupt, n)
	}
	return k[5 : 5+n], keyGroup, k[5+n:], nil
}

// prefixEnd returns the smallest key greater than every key with prefix p,
// or nil when there is none (p is all 0xff).
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
