package scaleout

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// RecordKind says what a commit record does.
type RecordKind uint8

const (
	// KindCommitRecord completes a checkpoint of the task.
	KindCommitRecord RecordKind = 1
	// KindClaim fences older owner epochs; it completes nothing.
	KindClaim RecordKind = 2
)

// Bounds of a decoded record (a record is one RocketMQ message).
const (
	maxTaskLen     = 512
	maxWorkerLen   = 256
	maxSegments    = 4096
	maxHistory     = 1024
	maxSinkTxns    = 4096
	maxSinkInfoLen = 1 << 20
	// MaxHistory is how many owner-epoch transitions a record carries.
	MaxHistory = 64
)

// recordMagic starts every encoded record; the byte after it is the format
// version.
var recordMagic = [2]byte{'R', 'C'}

const recordVersion = 1

// ErrBadRecord is returned (wrapped) for a commit record that cannot be
// decoded.
var ErrBadRecord = errors.New("scaleout: bad commit record")

// Segment is a range of a changelog queue: among the messages [From, To),
// the chunks tagged with Nonce hold one checkpoint's batch (or, for a
// snapshot, a whole store as of checkpoint Seq).
type Segment struct {
	Seq      uint64
	Nonce    uint64
	From, To int64
}

// EpochStart is an owner-epoch transition: from checkpoint FromSeq on, the
// task's checkpoints are owner epoch Epoch's.
type EpochStart struct {
	Epoch   uint64
	FromSeq uint64
}

// SinkTxn is one sink transaction a record completes: the sink's UID, the
// sink epoch (checkpoint id) it was pre-committed for, and what the sink
// needs to answer check-backs for it (opaque to this package).
type SinkTxn struct {
	Sink  string
	Epoch uint64
	Info  []byte
}

// Record is one entry of a task's commit chain.
type Record struct {
	Kind RecordKind
	// Task is TaskID.String().
	Task string
	// OwnerEpoch is the writer's owner epoch.
	OwnerEpoch uint64
	// Seq is the checkpoint id the record completes (a claim: its previous
	// valid record's seq).
	Seq uint64
	// PrevSeq and PrevOffset name the previous valid record (PrevOffset -1
	// for a task's first record).
	PrevSeq    uint64
	PrevOffset int64
	// Nonce identifies one write: a retried send of the same record keeps
	// it, so a writer recognises its own record among duplicates.
	Nonce uint64
	// Fingerprint is the hash of the job's checkpoint fingerprint.
	Fingerprint [32]byte
	// Worker names the writer (its client id).
	Worker string
	// TimeMs is the writer's clock at writing (Unix ms).
	TimeMs int64
	// Snapshot is the latest snapshot of the task's store (Seq 0: none).
	Snapshot Segment
	// Segments are the changelog segments after the snapshot, oldest
	// first; a commit record's own segment is the last.
	Segments []Segment
	// History holds the latest owner-epoch transitions, oldest first.
	History []EpochStart
	// Sinks are the sink transactions completed by the record.
	Sinks []SinkTxn
}

// AppendRecord appends r's encoding to dst.
func AppendRecord(dst []byte, r *Record) []byte {
	dst = append(dst, recordMagic[0], recordMagic[1], recordVersion, byte(r.Kind))
	dst = appendStr(dst, r.Task)
	dst = binary.AppendUvarint(dst, r.OwnerEpoch)
	dst = binary.AppendUvarint(dst, r.Seq)
	dst = binary.AppendUvarint(dst, r.PrevSeq)
	dst = binary.AppendVarint(dst, r.PrevOffset)
	dst = binary.BigEndian.AppendUint64(dst, r.Nonce)
	dst = append(dst, r.Fingerprint[:]...)
	dst = appendStr(dst, r.Worker)
	dst = binary.AppendVarint(dst, r.TimeMs)
	dst = appendSegment(dst, r.Snapshot)
	dst = binary.AppendUvarint(dst, uint64(len(r.Segments)))
	for _, s := range r.Segments {
		dst = appendSegment(dst, s)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.History)))
	for _, h := range r.History {
		dst = binary.AppendUvarint(dst, h.Epoch)
		dst = binary.AppendUvarint(dst, h.FromSeq)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Sinks)))
	for _, s := range r.Sinks {
		dst = appendStr(dst, s.Sink)
		dst = binary.AppendUvarint(dst, s.Epoch)
		dst = binary.AppendUvarint(dst, uint64(len(s.Info)))
		dst = append(dst, s.Info...)
	}
	return dst
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendSegment(dst []byte, s Segment) []byte {
	dst = binary.AppendUvarint(dst, s.Seq)
	dst = binary.BigEndian.AppendUint64(dst, s.Nonce)
	dst = binary.AppendVarint(dst, s.From)
	return binary.AppendVarint(dst, s.To)
}

// DecodeRecord decodes a record, checking every length against its bound
// and the record's own consistency (segment ranges, epochs in order). The
// record's slices do not alias b.
func DecodeRecord(b []byte) (*Record, error) {
	d := decoder{b: b}
	if len(b) < 4 || b[0] != recordMagic[0] || b[1] != recordMagic[1] {
		return nil, fmt.Errorf("%w: no magic", ErrBadRecord)
	}
	if b[2] != recordVersion {
		return nil, fmt.Errorf("%w: format version %d (this build reads %d)", ErrBadRecord, b[2], recordVersion)
	}
	r := &Record{Kind: RecordKind(b[3])}
	d.b = b[4:]
	if r.Kind != KindCommitRecord && r.Kind != KindClaim {
		return nil, fmt.Errorf("%w: kind %d", ErrBadRecord, r.Kind)
	}
	r.Task = d.str("task", maxTaskLen)
	r.OwnerEpoch = d.uvarint("owner epoch", 1<<62)
	r.Seq = d.uvarint("seq", 1<<62)
	r.PrevSeq = d.uvarint("previous seq", 1<<62)
	r.PrevOffset = d.varint("previous offset")
	r.Nonce = d.u64("nonce")
	copy(r.Fingerprint[:], d.bytes("fingerprint", 32))
	r.Worker = d.str("worker", maxWorkerLen)
	r.TimeMs = d.varint("time")
	r.Snapshot = d.segment()
	if n := d.uvarint("segments", maxSegments); n > 0 {
		r.Segments = make([]Segment, 0, n)
		for range n {
			r.Segments = append(r.Segments, d.segment())
		}
	}
	if n := d.uvarint("history", maxHistory); n > 0 {
		r.History = make([]EpochStart, 0, n)
		for range n {
			r.History = append(r.History, EpochStart{Epoch: d.uvarint("history epoch", 1<<62), FromSeq: d.uvarint("history seq", 1<<62)})
		}
	}
	if n := d.uvarint("sink transactions", maxSinkTxns); n > 0 {
		r.Sinks = make([]SinkTxn, 0, n)
		for range n {
			s := SinkTxn{Sink: d.str("sink", maxTaskLen), Epoch: d.uvarint("sink epoch", 1<<62)}
			s.Info = append([]byte(nil), d.bytes("sink info", int(d.uvarint("sink info length", maxSinkInfoLen)))...)
			r.Sinks = append(r.Sinks, s)
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrBadRecord, len(d.b))
	}
	return r, r.check()
}

// check enforces what every writer guarantees.
func (r *Record) check() error {
	switch {
	case r.Task == "":
		return fmt.Errorf("%w: no task", ErrBadRecord)
	case r.PrevOffset < -1:
		return fmt.Errorf("%w: previous offset %d", ErrBadRecord, r.PrevOffset)
	case r.Kind == KindClaim && r.Seq != r.PrevSeq:
		return fmt.Errorf("%w: claim with seq %d after %d", ErrBadRecord, r.Seq, r.PrevSeq)
	case r.Kind == KindCommitRecord && r.Seq <= r.PrevSeq:
		return fmt.Errorf("%w: seq %d not after %d", ErrBadRecord, r.Seq, r.PrevSeq)
	}
	for _, s := range append([]Segment{r.Snapshot}, r.Segments...) {
		if s.From < 0 || s.To < s.From {
			return fmt.Errorf("%w: segment [%d, %d)", ErrBadRecord, s.From, s.To)
		}
	}
	for i := 1; i < len(r.Segments); i++ {
		if r.Segments[i].Seq <= r.Segments[i-1].Seq {
			return fmt.Errorf("%w: segments out of order", ErrBadRecord)
		}
	}
	for i := 1; i < len(r.History); i++ {
		if r.History[i].Epoch <= r.History[i-1].Epoch || r.History[i].FromSeq < r.History[i-1].FromSeq {
			return fmt.Errorf("%w: owner-epoch history out of order", ErrBadRecord)
		}
	}
	if n := len(r.History); n > 0 && r.History[n-1].Epoch != r.OwnerEpoch {
		return fmt.Errorf("%w: history ends at epoch %d, record is %d's", ErrBadRecord, r.History[n-1].Epoch, r.OwnerEpoch)
	}
	return nil
}

// decoder reads with a sticky error: after the first short or oversized
// field every read returns zero values and err says what failed.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrBadRecord, what)
	}
	d.b = nil
}

func (d *decoder) uvarint(what string, limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated " + what)
		return 0
	}
	if v > limit {
		d.fail(fmt.Sprintf("%s %d over %d", what, v, limit))
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("truncated " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64(what string) uint64 {
	b := d.bytes(what, 8)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func (d *decoder) bytes(what string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail("truncated " + what)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(what string, limit int) string {
	return string(d.bytes(what, int(d.uvarint(what+" length", uint64(limit)))))
}

func (d *decoder) segment() Segment {
	return Segment{Seq: d.uvarint("segment seq", 1<<62), Nonce: d.u64("segment nonce"), From: d.varint("segment start"), To: d.varint("segment end")}
}
