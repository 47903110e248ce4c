package checkpoint

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// Savepoint file format (all integers big-endian):
//
//	header: magic "RNLSAVEP" | version u32 | metaLen u32 | metadata JSON | crc32c u32
//	record: length u32 | crc32c(payload) u32 | payload[length]
//	payload: type u8 | fields, each byte string as uvarint length + bytes
//	  recOffset  split key, offset
//	  recPending sink UID, uvarint subtask, uvarint checkpoint id, data
//	  recState   operator UID, uvarint key group, key, value
//	  recEnd     uvarint number of records before it (must be last)
//
// The reader checks every length against the bounds below before
// allocating, every checksum, and that the end record is present and counts
// right (a truncated file is an error, never a partial restore).
const (
	savepointMagic = "RNLSAVEP"
	// MaxSavepointMetadata bounds the header's metadata JSON.
	MaxSavepointMetadata = 1 << 20
	// MaxSavepointRecord bounds one record's payload.
	MaxSavepointRecord = MaxKeyLen + MaxValueLen + MaxUIDLen + 64

	recOffset  byte = 1
	recPending byte = 2
	recState   byte = 3
	recEnd     byte = 0xff
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// savepointRecord is one decoded record; its slices alias the reader's
// buffer and are valid until the next record.
type savepointRecord struct {
	typ      byte
	uid      []byte // recState: operator UID; recPending: sink UID
	key      []byte // recOffset: split key; recState: key
	value    []byte // offset, pending data, state value
	keyGroup uint16
	subtask  int
	cpID     uint64
}

type savepointWriter struct {
	w     *bufio.Writer
	buf   []byte
	count uint64
}

func appendBytes(dst, b []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(b))), b...)
}

func (sw *savepointWriter) record(r *savepointRecord) error {
	p := append(sw.buf[:0], 0, 0, 0, 0, 0, 0, 0, 0, r.typ)
	switch r.typ {
	case recOffset:
		p = appendBytes(appendBytes(p, r.key), r.value)
	case recPending:
		p = appendBytes(p, r.uid)
		p = binary.AppendUvarint(p, uint64(r.subtask))
		p = binary.AppendUvarint(p, r.cpID)
		p = appendBytes(p, r.value)
	case recState:
		p = appendBytes(p, r.uid)
		p = binary.AppendUvarint(p, uint64(r.keyGroup))
		p = appendBytes(appendBytes(p, r.key), r.value)
	case recEnd:
		p = binary.AppendUvarint(p, sw.count)
	}
	payload := p[8:]
	binary.BigEndian.PutUint32(p[0:], uint32(len(payload)))
	binary.BigEndian.PutUint32(p[4:], crc32.Checksum(payload, castagnoli))
	sw.buf = p
	sw.count++
	if _, err := sw.w.Write(p); err != nil {
		return fmt.Errorf("checkpoint: write savepoint: %w", err)
	}
	return nil
}

// WriteSavepoint writes the latest completed checkpoint (metadata, offsets,
// pending commits, all state) to w in the savepoint format (a versioned,
// checksummed stream: see the comment in savepoint.go). It reads a Pebble
// snapshot, so commits may go on meanwhile. It fails when there is no
// completed checkpoint. ctx is checked every 1024 records.
func (s *Store) WriteSavepoint(ctx context.Context, w io.Writer) error {
	sv, err := s.NewSavepoint()
	if err != nil {
		return err
	}
	defer sv.Close()
	return sv.WriteTo(ctx, w)
}

// Savepoint is the latest completed checkpoint of a store frozen at the
// moment NewSavepoint was called, to be written later (and while commits go
// on): scale-out takes one right after a checkpoint and streams it to the
// broker in the background. It must be closed; it is not safe for
// concurrent use.
type Savepoint struct {
	s    *Store
	snap *pebble.Snapshot
	m    Metadata
}

// NewSavepoint freezes the latest completed checkpoint; it fails when there
// is none.
func (s *Store) NewSavepoint() (*Savepoint, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	// Take the snapshot under commitMu so that it and the metadata agree.
	s.commitMu.Lock()
	snap := s.db.NewSnapshot()
	m, ok := s.Latest()
	s.commitMu.Unlock()
	if !ok {
		_ = snap.Close()
		return nil, errors.New("checkpoint: no completed checkpoint to save")
	}
	return &Savepoint{s: s, snap: snap, m: m}, nil
}

// Metadata is the frozen checkpoint's metadata.
func (sv *Savepoint) Metadata() Metadata { return sv.m }

// Close releases the frozen view.
func (sv *Savepoint) Close() error { return sv.snap.Close() }

// WriteTo writes the frozen checkpoint to w in the savepoint format.
func (sv *Savepoint) WriteTo(ctx context.Context, w io.Writer) error {
	s, snap, m := sv.s, sv.snap, sv.m
	mb, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("checkpoint: encode metadata: %w", err)
	}
	sw := &savepointWriter{w: bufio.NewWriterSize(w, 256<<10)}
	hdr := append([]byte(savepointMagic), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(hdr[8:], FormatVersion)
	binary.BigEndian.PutUint32(hdr[12:], uint32(len(mb)))
	hdr = append(hdr, mb...)
	hdr = binary.BigEndian.AppendUint32(hdr, crc32.Checksum(hdr, castagnoli))
	if _, err := sw.w.Write(hdr); err != nil {
		return fmt.Errorf("checkpoint: write savepoint: %w", err)
	}
	n := 0
	err = s.scan(snap, []byte{famOffset}, []byte{famEnd}, func(k, v []byte) error {
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		r := savepointRecord{value: v}
		switch k[0] {
		case famOffset:
			r.typ, r.key = recOffset, k[1:]
		case famPending:
			p, err := parsePendingKey(k)
			if err != nil {
				return err
			}
			r.typ, r.uid, r.subtask, r.cpID = recPending, []byte(p.SinkUID), p.Subtask, p.CheckpointID
		case famState:
			uid, kg, key, err := parseStateKey(k)
			if err != nil {
				return err
			}
			r.typ, r.uid, r.keyGroup, r.key = recState, uid, kg, key
		}
		return sw.record(&r)
	})
	if err != nil {
		return fmt.Errorf("checkpoint: savepoint: %w", err)
	}
	if err := sw.record(&savepointRecord{typ: recEnd}); err != nil {
		return err
	}
	if err := sw.w.Flush(); err != nil {
		return fmt.Errorf("checkpoint: write savepoint: %w", err)
	}
	return nil
}

// savepointReader decodes the savepoint format with every length bounded.
type savepointReader struct {
	r     *bufio.Reader
	buf   []byte
	count uint64
	done  bool
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: savepoint: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// readSavepointHeader reads and checks the header.
func readSavepointHeader(r *bufio.Reader) (*savepointReader, Metadata, error) {
	var m Metadata
	hdr := make([]byte, 16)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, m, corruptf("header: %v", err)
	}
	if string(hdr[:8]) != savepointMagic {
		return nil, m, corruptf("bad magic %q", hdr[:8])
	}
	version := binary.BigEndian.Uint32(hdr[8:])
	if version > FormatVersion {
		return nil, m, fmt.Errorf("%w: savepoint has format %d, this build reads up to %d", ErrFormatTooNew, version, FormatVersion)
	}
	if version == 0 {
		return nil, m, corruptf("format version 0")
	}
	n := binary.BigEndian.Uint32(hdr[12:])
	if n > MaxSavepointMetadata {
		return nil, m, corruptf("metadata of %d bytes (max %d)", n, MaxSavepointMetadata)
	}
	hdr = append(hdr, make([]byte, n+4)...)
	if _, err := io.ReadFull(r, hdr[16:]); err != nil {
		return nil, m, corruptf("header: %v", err)
	}
	body := hdr[:16+n]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(hdr[16+n:]) {
		return nil, m, corruptf("header checksum")
	}
	if err := json.Unmarshal(body[16:], &m); err != nil {
		return nil, m, corruptf("metadata: %v", err)
	}
	return &savepointReader{r: r}, m, nil
}

// next decodes the next record; io.EOF after the end record.
func (sr *savepointReader) next(rec *savepointRecord) error {
	if sr.done {
		return io.EOF
	}
	var h [8]byte
	if _, err := io.ReadFull(sr.r, h[:]); err != nil {
		return corruptf("record %d: %v (truncated?)", sr.count, err)
	}
	n := binary.BigEndian.Uint32(h[:])
	if n == 0 || n > MaxSavepointRecord {
		return corruptf("record %d of %d bytes", sr.count, n)
	}
	if cap(sr.buf) < int(n) {
		sr.buf = make([]byte, n)
	}
	p := sr.buf[:n]
	if _, err := io.ReadFull(sr.r, p); err != nil {
		return corruptf("record %d: %v (truncated?)", sr.count, err)
	}
	if crc32.Checksum(p, castagnoli) != binary.BigEndian.Uint32(h[4:]) {
		return corruptf("record %d checksum", sr.count)
	}
	*rec = savepointRecord{typ: p[0]}
	d := decoder{b: p[1:]}
	switch rec.typ {
	case recOffset:
		rec.key, rec.value = d.bytes(MaxKeyLen), d.bytes(MaxValueLen)
	case recPending:
		rec.uid = d.bytes(MaxUIDLen)
		rec.subtask = int(d.uvarint(1<<31 - 1))
		rec.cpID = d.uvarint(1<<64 - 1)
		rec.value = d.bytes(MaxValueLen)
	case recState:
		rec.uid = d.bytes(MaxUIDLen)
		rec.keyGroup = uint16(d.uvarint(0xffff))
		rec.key, rec.value = d.bytes(MaxKeyLen), d.bytes(MaxValueLen)
	case recEnd:
		if c := d.uvarint(1<<64 - 1); d.err == nil && c != sr.count {
			return corruptf("end record counts %d records, read %d", c, sr.count)
		}
		sr.done = true
	default:
		return corruptf("record %d has unknown type %d", sr.count, rec.typ)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errors.New("trailing bytes")
	}
	if d.err != nil {
		return corruptf("record %d: %v", sr.count, d.err)
	}
	if (rec.typ == recState || rec.typ == recPending) && len(rec.uid) == 0 {
		return corruptf("record %d: empty UID", sr.count)
	}
	if rec.typ == recOffset && len(rec.key) == 0 {
		return corruptf("record %d: empty split key", sr.count)
	}
	sr.count++
	return nil
}

// decoder reads fields with a sticky error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint(max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad varint")
		return 0
	}
	if v > max {
		d.err = fmt.Errorf("value %d above %d", v, max)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(max int) []byte {
	n := d.uvarint(uint64(max))
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("field of %d bytes, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// RestoreSavepoint loads a savepoint into the store in dir (created if
// needed), which must hold no completed checkpoint. When the savepoint's
// fingerprint does not match opts.Fingerprint it fails with
// ErrFingerprintMismatch unless every differing operator is listed in
// dropOperators, whose state is then left out (a changed max parallelism
// cannot be dropped). The restored checkpoint keeps the savepoint's ID and
// gets opts.Fingerprint (the savepoint's when opts has none). A restore
// interrupted by a crash leaves a marker that makes Open fail with
// ErrIncompleteRestore until a restore completes. ctx is checked between
// batches.
func RestoreSavepoint(ctx context.Context, dir string, r io.Reader, opts Options, dropOperators ...string) error {
	s, sr, m, fp, err := openRestoreTarget(dir, r, opts, dropOperators)
	if err != nil {
		return err
	}
	if err := s.restore(ctx, sr, m, fp, dropOperators); err != nil {
		_ = s.Close()
		return err
	}
	return s.Close()
}

// appendStoreKey appends to dst the key under which the store keeps rec
// (offsets, pending commits and state); ok is false for a record of
// another type, which has none.
func (rec *savepointRecord) appendStoreKey(dst []byte) (key []byte, ok bool, err error) {
	switch rec.typ {
	case recOffset:
		return append(append(dst, famOffset), rec.key...), true, nil
	case recPending:
		k, err := pendingKey(&PendingCommit{SinkUID: string(rec.uid), Subtask: rec.subtask, CheckpointID: rec.cpID})
		return append(dst, k...), err == nil, err
	case recState:
		return append(appendStatePrefix(dst, string(rec.uid), rec.keyGroup), rec.key...), true, nil
	}
	return dst, false, nil
}

// openRestoreTarget reads the savepoint header from r, checks its
// fingerprint against opts' (the operators in drop may differ; none given,
// the savepoint's is taken) and opens the store in dir that a restore
// loads it into.
func openRestoreTarget(dir string, r io.Reader, opts Options, drop []string) (*Store, *savepointReader, Metadata, Fingerprint, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	sr, m, err := readSavepointHeader(br)
	if err != nil {
		return nil, nil, m, Fingerprint{}, err
	}
	fp := opts.Fingerprint
	if fp.IsZero() {
		fp = m.Fingerprint
	} else if err := diffFingerprints(m.Fingerprint, fp).err(fmt.Sprintf("savepoint of checkpoint %d", m.ID), drop); err != nil {
		return nil, nil, m, fp, err
	}
	s, err := open(dir, opts)
	if err != nil {
		return nil, nil, m, fp, err
	}
	return s, sr, m, fp, nil
}

func (s *Store) restore(ctx context.Context, sr *savepointReader, m Metadata, fp Fingerprint, drop []string) error {
	if _, ok := s.Latest(); ok {
		if err := s.checkRestoring(); err == nil {
			return fmt.Errorf("%w: restore a savepoint into an empty directory", ErrNotEmpty)
		}
	}
	m.Savepoint = true
	_, err := s.load(ctx, sr, m, fp, drop, m.ID, "", true)
	return err
}

// load replaces the store's offsets, pending commits and state by sr's
// records and makes m, with id, its latest checkpoint. clearMeta also drops
// the metadata history (a restore into a new directory). spec, when set, is
// recorded as the applied restore (RestoreFrom).
func (s *Store) load(ctx context.Context, sr *savepointReader, m Metadata, fp Fingerprint, drop []string, id uint64, spec string, clearMeta bool) (Metadata, error) {
	// First batch: the marker, and clear whatever was there (or an
	// interrupted restore left behind).
	b := s.db.NewBatch()
	defer func() { _ = b.Close() }()
	if err := b.Set(keyRestoring, nil, nil); err != nil {
		return Metadata{}, err
	}
	if err := b.Delete(keyLatest, nil); err != nil {
		return Metadata{}, err
	}
	from := []byte{famOffset}
	if clearMeta {
		from = []byte{famMeta}
	}
	if err := b.DeleteRange(from, []byte{famEnd}, nil); err != nil {
		return Metadata{}, err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
	}
	s.mu.Lock()
	hist := s.mu.history
	s.mu.history = nil
	s.mu.Unlock()
	if clearMeta {
		hist = nil
	}
	b.Reset()
	var rec savepointRecord
	var buf []byte
	for {
		err := sr.next(&rec)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Metadata{}, err
		}
		if rec.typ == recState && slices.Contains(drop, string(rec.uid)) {
			continue
		}
		var ok bool
		buf, ok, err = rec.appendStoreKey(buf[:0])
		if err == nil && ok {
			err = b.Set(buf, rec.value, nil)
		}
		if err != nil {
			return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
		}
		if b.Len() >= 4<<20 {
			if err := ctx.Err(); err != nil {
				return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
			}
			if err := b.Commit(pebble.NoSync); err != nil {
				return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
			}
			b.Reset()
		}
	}
	m.ID = id
	m.FormatVersion = FormatVersion
	m.Fingerprint = fp
	mb, err := json.Marshal(m)
	if err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: encode metadata: %w", err)
	}
	ops := []struct{ k, v []byte }{
		{metaKey(m.ID), mb},
		{keyLatest, binary.BigEndian.AppendUint64(nil, m.ID)},
	}
	if spec != "" {
		ops = append(ops, struct{ k, v []byte }{keyApplied, []byte(spec)})
	}
	for _, op := range ops {
		if err := b.Set(op.k, op.v, nil); err != nil {
			return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
		}
	}
	if err := b.Delete(keyRestoring, nil); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: restore: %w", err)
	}
	hist = append([]Metadata{m}, hist...)
	if len(hist) > s.opts.Retain {
		hist = hist[:s.opts.Retain]
	}
	s.mu.Lock()
	s.mu.history = hist
	s.mu.Unlock()
	return m, nil
}
