package store

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// MetaBatch collects meta key changes and consumer offset commits that
// must become durable together (a POP checkpoint and the offset past its
// messages; the acks of one BATCH_ACK_MESSAGE). Build it with
// [Store.NewMetaBatch], then Commit or Close it once; it is not safe for
// concurrent use.
type MetaBatch struct {
	s   *Store
	b   *pebble.Batch
	n   int
	err error // sticky: the first invalid argument
}

// NewMetaBatch returns an empty batch.
func (s *Store) NewMetaBatch() *MetaBatch { return &MetaBatch{s: s, b: s.db.NewBatch()} }

// Len returns the number of changes collected.
func (mb *MetaBatch) Len() int { return mb.n }

func (mb *MetaBatch) keep(err error) {
	if mb.err == nil && err != nil {
		mb.err = err
	}
	if err == nil {
		mb.n++
	}
}

// PutMeta sets a meta key (as [Store.PutMeta]).
func (mb *MetaBatch) PutMeta(key, value []byte) {
	if err := checkMetaKey(key); err != nil {
		mb.keep(err)
		return
	}
	if len(value) > MaxValueLen {
		mb.keep(fmt.Errorf("%w: meta value of %d bytes", ErrInvalid, len(value)))
		return
	}
	if value == nil {
		value = []byte{}
	}
	mb.keep(mb.b.Set(metaKey(key), value, nil))
}

// DeleteMeta removes a meta key (no error if absent).
func (mb *MetaBatch) DeleteMeta(key []byte) {
	if err := checkMetaKey(key); err != nil {
		mb.keep(err)
		return
	}
	mb.keep(mb.b.Delete(metaKey(key), nil))
}

// CommitOffset stores a consumer offset (as [Store.CommitOffset]).
func (mb *MetaBatch) CommitOffset(group, topic string, queue int32, off int64) {
	if err := checkOffsetArgs(group, topic, queue); err != nil {
		mb.keep(err)
		return
	}
	if off < 0 {
		mb.keep(fmt.Errorf("%w: consumer offset %d", ErrInvalid, off))
		return
	}
	var kb [128]byte
	var vb [8]byte
	binary.BigEndian.PutUint64(vb[:], uint64(off))
	mb.keep(mb.b.Set(appendOffsetKey(kb[:0], group, topic, queue), vb[:], nil))
}

// Commit writes the changes in one Pebble batch, with an fsync when sync
// is set (without, they survive as a CommitOffset does: readable at once,
// durable with the next fsync), and releases the batch. An invalid
// argument given to any change fails the whole batch, which then writes
// nothing.
func (mb *MetaBatch) Commit(sync bool) error {
	defer mb.Close()
	if mb.err != nil {
		return mb.err
	}
	if mb.n == 0 {
		return nil
	}
	if err := mb.s.acquire(); err != nil {
		return err
	}
	defer mb.s.release()
	return mb.s.commitBatch(mb.b, sync, "meta batch")
}

// Close releases the batch without writing it; it is a no-op after
// Commit.
func (mb *MetaBatch) Close() {
	if mb.b != nil {
		_ = mb.b.Close()
		mb.b = nil
	}
}
