package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
)

// MaxBatchRepr bounds a batch ApplyBatch accepts.
const MaxBatchRepr = 1 << 30

// ApplyBatch replays on this store a batch that another store's Commit
// captured (Commit.CaptureBatch): the store becomes an exact replica of that
// one as of the batch's checkpoint, provided it was a replica as of the
// previous one. It checks before applying anything that the batch is a
// checkpoint batch whose id is above this store's latest (so a batch
// applied twice, or out of order, is refused with ErrStaleID), and that its
// keys are the store's own families. With sync, the write is synced;
// replicas that are rebuilt from the broker anyway may skip it. Calls are
// serialised with Commit. It returns the metadata of the checkpoint the
// store is now at.
func (s *Store) ApplyBatch(repr []byte, sync bool) (Metadata, error) {
	if len(repr) > MaxBatchRepr {
		return Metadata{}, fmt.Errorf("%w: batch of %d bytes", ErrInvalid, len(repr))
	}
	id, prev, err := batchCheckpoint(repr)
	if err != nil {
		return Metadata{}, err
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if s.closed() {
		return Metadata{}, ErrClosed
	}
	latest, _ := s.Latest()
	if id <= latest.ID {
		return Metadata{}, fmt.Errorf("%w: batch of checkpoint %d after %d", ErrStaleID, id, latest.ID)
	}
	if prev != latest.ID {
		return Metadata{}, fmt.Errorf("%w: batch of checkpoint %d follows %d, the store is at %d", ErrNotNext, id, prev, latest.ID)
	}
	b := s.db.NewBatch()
	defer func() { _ = b.Close() }()
	if err := b.SetRepr(append([]byte(nil), repr...)); err != nil {
		return Metadata{}, fmt.Errorf("%w: batch: %w", ErrCorrupt, err)
	}
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	if err := s.db.Apply(b, opts); err != nil {
		return Metadata{}, fmt.Errorf("checkpoint: apply batch of checkpoint %d: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.loadHistory(); err != nil {
		return Metadata{}, err
	}
	if len(s.mu.history) == 0 || s.mu.history[0].ID != id {
		return Metadata{}, fmt.Errorf("%w: applied batch of checkpoint %d, store at another", ErrCorrupt, id)
	}
	return s.mu.history[0], nil
}

// batchCheckpoint reads a captured batch and returns the checkpoint id its
// latest pointer names and the id of the checkpoint it follows (from its
// metadata), checking that every key is of a known family.
func batchCheckpoint(repr []byte) (id, prev uint64, err error) {
	h, ok := batchrepr.ReadHeader(repr)
	if !ok {
		return 0, 0, fmt.Errorf("%w: batch shorter than its header", ErrCorrupt)
	}
	r := batchrepr.Read(repr)
	var n uint32
	metas := map[uint64][]byte{}
	for {
		kind, ukey, value, ok, err := r.Next()
		if err != nil {
			return 0, 0, fmt.Errorf("%w: batch: %w", ErrCorrupt, err)
		}
		if !ok {
			break
		}
		n++
		if len(ukey) == 0 || ukey[0] >= famEnd {
			return 0, 0, fmt.Errorf("%w: batch key %x of no family", ErrCorrupt, ukey)
		}
		switch {
		case kind != pebble.InternalKeyKindSet:
		case string(ukey) == string(keyLatest):
			if len(value) != 8 {
				return 0, 0, fmt.Errorf("%w: latest pointer of %d bytes", ErrCorrupt, len(value))
			}
			id = binary.BigEndian.Uint64(value)
		case ukey[0] == famMeta && len(ukey) == 9:
			metas[binary.BigEndian.Uint64(ukey[1:])] = value
		}
	}
	if n != h.Count {
		return 0, 0, fmt.Errorf("%w: batch holds %d operations, header says %d", ErrCorrupt, n, h.Count)
	}
	if id == 0 {
		return 0, 0, fmt.Errorf("%w: batch sets no latest checkpoint", ErrCorrupt)
	}
	mb, ok := metas[id]
	if !ok {
		return 0, 0, fmt.Errorf("%w: batch of checkpoint %d has no metadata", ErrCorrupt, id)
	}
	var m Metadata
	if err := json.Unmarshal(mb, &m); err != nil || m.ID != id {
		return 0, 0, fmt.Errorf("%w: metadata of checkpoint %d in its batch", ErrCorrupt, id)
	}
	return id, m.Prev, nil
}
