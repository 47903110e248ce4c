package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/runnel-dev/runnel/internal/invariants"
)

// Part is one owner's contribution to a checkpoint (a keyed operator's state
// changes, say). Commit calls WriteTo on the committing goroutine; WriteTo
// must only add to w and must not retain it. An error fails the Commit.
type Part interface {
	WriteTo(w *Writer) error
}

// PartSizer is a Part that knows about how many bytes it writes: Commit
// sizes the batch once for all its parts instead of growing it.
type PartSizer interface {
	Part
	// SizeHint is the approximate number of bytes WriteTo adds.
	SizeHint() int
}

// maxRetainedBatch bounds the buffer of the batch that Commit keeps for the
// next commit.
const maxRetainedBatch = 64 << 20

// Writer adds state changes to the checkpoint batch being built. It is valid
// only during Part.WriteTo and is not safe for concurrent use. Its methods
// copy their arguments.
type Writer struct {
	s       *Store
	b       *pebble.Batch
	buf     []byte
	buf2    []byte
	changes int
	live    bool
	// pfx is the state prefix of (pfxUID, pfxKG) when pfxOK.
	pfx    []byte
	pfxUID string
	pfxKG  uint16
	pfxOK  bool
}

func (w *Writer) check(uid string, key []byte) error {
	if invariants.Enabled && (!w.live || !w.s.writing) {
		panic("checkpoint: Writer used outside Commit")
	}
	if !w.live {
		return fmt.Errorf("%w: Writer used outside Commit", ErrInvalid)
	}
	if err := checkUID(uid); err != nil {
		return err
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: state key of %d bytes (max %d)", ErrInvalid, len(key), MaxKeyLen)
	}
	return nil
}

// PutState records key=value for (operatorUID, keyGroup).
func (w *Writer) PutState(operatorUID string, keyGroup uint16, key, value []byte) error {
	if err := w.check(operatorUID, key); err != nil {
		return err
	}
	if len(value) > MaxValueLen {
		return fmt.Errorf("%w: state value of %d bytes (max %d)", ErrInvalid, len(value), MaxValueLen)
	}
	p := w.statePrefix(operatorUID, keyGroup)
	op := w.b.SetDeferred(len(p)+len(key), len(value))
	copy(op.Key[copy(op.Key, p):], key)
	copy(op.Value, value)
	w.changes++
	return op.Finish()
}

// statePrefix returns the store prefix of (operatorUID, keyGroup), kept
// from the previous call when that was for the same pair (a part writes
// its keys sorted, so in runs of one key group).
func (w *Writer) statePrefix(operatorUID string, keyGroup uint16) []byte {
	if !w.pfxOK || w.pfxKG != keyGroup || w.pfxUID != operatorUID {
		w.pfx = appendStatePrefix(w.pfx[:0], operatorUID, keyGroup)
		w.pfxUID, w.pfxKG, w.pfxOK = operatorUID, keyGroup, true
	}
	return w.pfx
}

// DeleteState records the deletion of key in (operatorUID, keyGroup).
func (w *Writer) DeleteState(operatorUID string, keyGroup uint16, key []byte) error {
	if err := w.check(operatorUID, key); err != nil {
		return err
	}
	w.buf = append(appendStatePrefix(w.buf[:0], operatorUID, keyGroup), key...)
	w.changes++
	return w.b.Delete(w.buf, nil)
}

// DeleteStateRange records the deletion of every key in [from, to) of
// (operatorUID, keyGroup); to == nil means every key that starts with from.
func (w *Writer) DeleteStateRange(operatorUID string, keyGroup uint16, from, to []byte) error {
	if err := w.check(operatorUID, from); err != nil {
		return err
	}
	if len(to) > MaxKeyLen {
		return fmt.Errorf("%w: range end of %d bytes", ErrInvalid, len(to))
	}
	w.buf = append(appendStatePrefix(w.buf[:0], operatorUID, keyGroup), from...)
	if to == nil {
		w.buf2 = append(w.buf2[:0], prefixEnd(w.buf)...)
		if len(w.buf2) == 0 {
			// from is all 0xff: end at the next (uid, key group) prefix.
			w.buf2 = prefixEnd(appendStatePrefix(w.buf2[:0], operatorUID, keyGroup))
		}
	} else {
		w.buf2 = append(appendStatePrefix(w.buf2[:0], operatorUID, keyGroup), to...)
	}
	w.changes++
	return w.b.DeleteRange(w.buf, w.buf2, nil)
}

// Commit is one checkpoint's content.
type Commit struct {
	// ID must be above the latest completed checkpoint's.
	ID uint64
	// Offsets are upserted: splits absent keep their previous offset; a nil
	// value deletes the split's offset.
	Offsets map[string][]byte
	// Pending are sink pre-commits added by this checkpoint, keyed by
	// (SinkUID, Subtask, CheckpointID): a repeat overwrites.
	Pending []PendingCommit
	// Resolved are pending commits their sinks have committed or aborted;
	// only the key fields are used. They are removed in the same batch.
	Resolved []PendingCommit
	// Parts write the state changes.
	Parts []Part
	// CaptureBatch asks Commit to leave in Batch a copy of the Pebble batch
	// it committed: the exact change from the previous checkpoint to this
	// one, which ApplyBatch replays on a replica of the store (scale-out
	// ships it to other workers). Batch reuses its previous capacity.
	CaptureBatch bool
	// Batch is set by Commit when CaptureBatch is.
	Batch []byte
	// Kind is stored in the metadata ("savepoint" for a checkpoint taken
	// as a savepoint; empty for a periodic one).
	Kind string
}

// Commit writes c atomically: offsets, every part's state changes, pending
// sink commits, the metadata (with Options.Fingerprint) and the "latest"
// pointer go into ONE Pebble batch committed with fsync, so either all of it
// is durable or none. Parts are written into the in-memory batch first, then
// the batch is synced; Commit blocks for both. Calls are serialised. ctx is
// checked between parts; once the sync starts it is no longer consulted.
func (s *Store) Commit(ctx context.Context, c *Commit) (m Metadata, err error) {
	start := time.Now()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	closed, failed := s.mu.closed, s.mu.failed
	s.mu.Unlock()
	if closed {
		return Metadata{}, ErrClosed
	}
	if failed != nil {
		return Metadata{}, fmt.Errorf("%w: %w", ErrFailed, failed)
	}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(*fatalError)
			if !ok {
				panic(r)
			}
			s.mu.Lock()
			s.mu.failed = f.err
			s.mu.Unlock()
			s.writing = false
			m, err = Metadata{}, fmt.Errorf("%w: commit %d: %w", ErrFailed, c.ID, f.err)
		}
	}()
	latest, hasLatest := s.Latest()
	if hasLatest && c.ID <= latest.ID {
		return Metadata{}, fmt.Errorf("%w: %d after %d", ErrStaleID, c.ID, latest.ID)
	}
	size := 0
	for _, p := range c.Parts {
		if ps, ok := p.(PartSizer); ok {
			size += ps.SizeHint()
		}
	}
	// One batch is reused across commits (they are serialised): a
	// checkpoint of many changes does not allocate its buffer again.
	b := s.batch
	if b == nil {
		b = s.db.NewBatchWithSize(size, pebble.WithMaxRetainedSizeBytes(maxRetainedBatch))
		s.batch = b
	}
	defer b.Reset()
	m = Metadata{
		ID:            c.ID,
		Prev:          latest.ID,
		Time:          start.UTC(),
		FormatVersion: FormatVersion,
		Fingerprint:   s.opts.Fingerprint,
		Kind:          c.Kind,
	}
	if err := s.writeOffsetsAndPending(b, c, &m); err != nil {
		return Metadata{}, err
	}
	w := &Writer{s: s, b: b, live: true}
	s.writing = true
	for _, p := range c.Parts {
		if err := ctx.Err(); err != nil {
			s.writing, w.live = false, false
			return Metadata{}, fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
		}
		if err := p.WriteTo(w); err != nil {
			s.writing, w.live = false, false
			return Metadata{}, fmt.Errorf("checkpoint: commit %d: part: %w", c.ID, err)
		}
	}
	s.writing, w.live = false, false
	m.StateChanges = w.changes
	m.Bytes = int64(b.Len())
	m.Duration = time.Since(start)
	mb, err := json.Marshal(m)
	if err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: encode metadata: %w", err)
	}
	if err := b.Set(metaKey(c.ID), mb, nil); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
	}
	hist := s.History()
	if len(hist) >= s.opts.Retain {
		for _, old := range hist[s.opts.Retain-1:] {
			if err := b.Delete(metaKey(old.ID), nil); err != nil {
				return Metadata{}, fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
			}
		}
		hist = hist[:s.opts.Retain-1]
	}
	if err := b.Set(keyLatest, binary.BigEndian.AppendUint64(nil, c.ID), nil); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
	}
	if c.CaptureBatch {
		c.Batch = append(c.Batch[:0], b.Repr()...)
	}
	if err := s.rotateForLargeBatch(b); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
	}
	entries := int(b.Count())
	if err := b.Commit(pebble.Sync); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
	}
	s.sinceRotate += entries
	m.Duration = time.Since(start)
	if invariants.Enabled {
		if v, ok, err := s.get(keyLatest); err != nil || !ok || binary.BigEndian.Uint64(v) != c.ID {
			panic("checkpoint: latest pointer does not name the committed checkpoint")
		}
	}
	s.mu.Lock()
	s.mu.history = append([]Metadata{m}, hist...)
	s.mu.Unlock()
	return m, nil
}

// RecommendedRotateMemTableAt is a value for Options.RotateMemTableAt: it
// leaves commits of up to about 30k entries to Pebble (a 10k-key
// checkpoint's p99 met its target without rotation) and rotates for the
// 100k-key ones, whose memtable insert was about 70% of Commit's CPU in
// BenchmarkSnapshotCommit.
const RecommendedRotateMemTableAt = 32 << 10

// rotateForLargeBatch makes Pebble start a new memtable (and flush the
// current one in the background) before b is committed, when
// Options.RotateMemTableAt asks for it, b is that large and the current
// memtable holds earlier commits. A checkpoint rewrites mostly the keys
// the previous ones wrote, and Pebble's skiplist insert only stays cheap
// for sorted keys while nothing lies between them: into a memtable that
// already holds older versions of the same keys, the cached splice fails
// on every key (its successor is that key's older version) and each
// insert searches from the skiplist's head; into an empty one it costs
// about a pointer update. The price is a flush per large checkpoint,
// which Pebble runs in the background. While the memtable rotated last
// time is still being flushed, the batch goes into the current memtable:
// a rotation then would wait for that flush (Pebble stalls writes while
// two full memtables are queued), and the commit should not depend on how
// far a background flush got.
func (s *Store) rotateForLargeBatch(b *pebble.Batch) error {
	at := s.opts.RotateMemTableAt
	if at <= 0 || int(b.Count()) < at || s.sinceRotate == 0 {
		return nil
	}
	if s.flushing != nil {
		select {
		case <-s.flushing:
			s.flushing = nil
		default:
			return nil
		}
	}
	flushed, err := s.db.AsyncFlush()
	if err != nil {
		return fmt.Errorf("rotate memtable: %w", err)
	}
	s.sinceRotate, s.flushing = 0, flushed
	return nil
}

func (s *Store) writeOffsetsAndPending(b *pebble.Batch, c *Commit, m *Metadata) error {
	splits := make([]string, 0, len(c.Offsets))
	for k := range c.Offsets {
		splits = append(splits, k)
	}
	slices.Sort(splits) // deterministic batches (golden tests, invariants)
	for _, k := range splits {
		v := c.Offsets[k]
		if k == "" || len(k) > MaxKeyLen || len(v) > MaxValueLen {
			return fmt.Errorf("%w: offset %q of %d bytes", ErrInvalid, k, len(v))
		}
		var err error
		if v == nil {
			err = b.Delete(offsetKey(k), nil)
		} else {
			err = b.Set(offsetKey(k), v, nil)
		}
		if err != nil {
			return fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
		}
		m.Offsets++
	}
	for i := range c.Resolved {
		k, err := pendingKey(&c.Resolved[i])
		if err != nil {
			return err
		}
		if err := b.Delete(k, nil); err != nil {
			return fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
		}
	}
	for i := range c.Pending {
		k, err := pendingKey(&c.Pending[i])
		if err != nil {
			return err
		}
		if len(c.Pending[i].Data) > MaxValueLen {
			return fmt.Errorf("%w: pending commit data of %d bytes", ErrInvalid, len(c.Pending[i].Data))
		}
		if err := b.Set(k, c.Pending[i].Data, nil); err != nil {
			return fmt.Errorf("checkpoint: commit %d: %w", c.ID, err)
		}
		m.PendingCommits++
	}
	return nil
}
