package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// ingestDirName is the directory, inside a store's directory, in which
// IngestSavepoint builds its sstables before Pebble takes them over.
const ingestDirName = "restore-ingest"

// ingestTableBytes is the size at which IngestSavepoint closes one sstable
// and hands it to Pebble.
const ingestTableBytes = 64 << 20

// IngestSavepoint is RestoreSavepoint for a whole store rebuilt from a
// savepoint (scale-out's restore of a task on an empty disk): instead of
// replaying the records through batches (write-ahead log, memtable,
// flushes, compactions) it writes them into sstables and ingests the
// files. A savepoint lists its records in the store's key order (it is a
// scan), so the tables do not overlap and Pebble places them in the
// bottom level, where nothing needs to rewrite them. A record out of order
// only closes the table being built: the next one is ingested on top, so a
// later record still wins, as in RestoreSavepoint.
//
// Atomicity is RestoreSavepoint's: a synced batch first sets the restore
// marker (Open fails with ErrIncompleteRestore while it is there); the
// tables are ingested after it; one synced batch at the end writes the
// checkpoint's metadata and latest pointer and removes the marker. A crash
// anywhere before that last batch leaves a store that Open refuses, never a
// part of the savepoint taken for a checkpoint. Operators cannot be dropped
// (RestoreSavepoint can): the fingerprint must match.
func IngestSavepoint(ctx context.Context, dir string, r io.Reader, opts Options) error {
	return ingestSavepoint(ctx, dir, r, opts, ingestConfig{tableBytes: ingestTableBytes})
}

// ingestConfig holds what tests vary: smaller tables, and the controls.
type ingestConfig struct {
	order      ingestOrder
	tableBytes uint64
}

// ingestOrder orders IngestSavepoint's steps; only tests choose another
// (their controls, which a crash must catch).
type ingestOrder int

const (
	ingestInOrder ingestOrder = iota
	// ingestLatestFirst is a CONTROL: the metadata and latest pointer are
	// committed, and the marker removed, before the tables are ingested.
	ingestLatestFirst
)

func ingestSavepoint(ctx context.Context, dir string, r io.Reader, opts Options, cfg ingestConfig) error {
	s, sr, m, fp, err := openRestoreTarget(dir, r, opts, nil)
	if err != nil {
		return err
	}
	if _, ok := s.Latest(); ok {
		if err := s.checkRestoring(); err == nil {
			_ = s.Close()
			return fmt.Errorf("%w: restore a savepoint into an empty directory", ErrNotEmpty)
		}
	}
	m.Savepoint = true
	if err := s.ingest(ctx, sr, m, fp, cfg); err != nil {
		_ = s.Close()
		return err
	}
	return s.Close()
}

// ingest loads sr into s by sstable ingestion and makes m its latest (and
// only) checkpoint.
func (s *Store) ingest(ctx context.Context, sr *savepointReader, m Metadata, fp Fingerprint, cfg ingestConfig) error {
	fs := vfs.Default
	if s.opts.FS != nil && s.opts.FS.VFS != nil {
		fs = s.opts.FS.VFS
	}
	tmp := fs.PathJoin(s.dir, ingestDirName)
	if err := fs.RemoveAll(tmp); err != nil { // an interrupted attempt's
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	if err := fs.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	defer func() { _ = fs.RemoveAll(tmp) }()

	// The marker, and the removal of whatever an interrupted restore left.
	b := s.db.NewBatch()
	defer func() { _ = b.Close() }()
	if err := b.Set(keyRestoring, nil, nil); err != nil {
		return err
	}
	if err := b.Delete(keyLatest, nil); err != nil {
		return err
	}
	held, err := s.holdsAny([]byte{famMeta}, []byte{famEnd})
	if err != nil {
		return err
	}
	if held {
		// Tables ingested over this range deletion land above it (level 0),
		// which compactions then rewrite: correct, only slower. Restore
		// callers that can start from an empty directory should.
		if err := b.DeleteRange([]byte{famMeta}, []byte{famEnd}, nil); err != nil {
			return err
		}
	}
	if cfg.order == ingestLatestFirst {
		if err := s.finishRestore(b, &m, fp); err != nil {
			return err
		}
	} else if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}

	po := &pebble.Options{}
	po.EnsureDefaults()
	wopts := po.MakeWriterOptions(len(po.Levels)-1, s.db.TableFormat())
	wopts.WritingToLowestLevel = false
	t := &tableBuilder{s: s, fs: fs, dir: tmp, wopts: wopts, limit: cfg.tableBytes}
	defer t.abort()
	var rec savepointRecord
	var key []byte
	for n := 0; ; n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("checkpoint: restore: %w", err)
			}
		}
		err := sr.next(&rec)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		var ok bool
		key, ok, err = rec.appendStoreKey(key[:0])
		if err == nil && !ok {
			continue
		}
		if err == nil {
			err = t.add(ctx, key, rec.value)
		}
		if err != nil {
			return fmt.Errorf("checkpoint: restore: %w", err)
		}
	}
	if err := t.finish(ctx); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	if cfg.order == ingestLatestFirst {
		return nil
	}
	b.Reset()
	return s.finishRestore(b, &m, fp)
}

// finishRestore commits, in b (synced), the restored checkpoint's metadata
// and latest pointer and the removal of the restore marker, and makes m the
// store's only retained checkpoint.
func (s *Store) finishRestore(b *pebble.Batch, m *Metadata, fp Fingerprint) error {
	m.FormatVersion = FormatVersion
	m.Fingerprint = fp
	mb, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("checkpoint: encode metadata: %w", err)
	}
	if err := b.Set(metaKey(m.ID), mb, nil); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	if err := b.Set(keyLatest, binary.BigEndian.AppendUint64(nil, m.ID), nil); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	if err := b.Delete(keyRestoring, nil); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("checkpoint: restore: %w", err)
	}
	s.mu.Lock()
	s.mu.history = []Metadata{*m}
	s.mu.Unlock()
	return nil
}

// holdsAny reports whether the store has a key in [lo, hi).
func (s *Store) holdsAny(lo, hi []byte) (bool, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return false, fmt.Errorf("checkpoint: read: %w", err)
	}
	found := it.First()
	if err := it.Close(); err != nil {
		return false, fmt.Errorf("checkpoint: read: %w", err)
	}
	return found, nil
}

// tableBuilder writes keys, in increasing order, into sstables of about
// ingestTableBytes and ingests each one when it is full or when a key does
// not follow the previous one.
type tableBuilder struct {
	s     *Store
	fs    vfs.FS
	dir   string
	wopts sstable.WriterOptions
	limit uint64 // table size

	w     *sstable.Writer
	path  string
	last  []byte
	files int
}

func (t *tableBuilder) add(ctx context.Context, key, value []byte) error {
	if t.w != nil && bytes.Compare(key, t.last) <= 0 {
		if err := t.finish(ctx); err != nil {
			return err
		}
	}
	if t.w == nil {
		t.files++
		t.path = t.fs.PathJoin(t.dir, strconv.Itoa(t.files)+".sst")
		f, err := t.fs.Create(t.path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		t.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), t.wopts)
	}
	if err := t.w.Set(key, value); err != nil {
		return err
	}
	t.last = append(t.last[:0], key...)
	if t.w.Raw().EstimatedSize() >= t.limit {
		return t.finish(ctx)
	}
	return nil
}

// finish closes the table being built (synced) and ingests it.
func (t *tableBuilder) finish(ctx context.Context) error {
	if t.w == nil {
		return nil
	}
	w := t.w
	t.w = nil
	if err := w.Close(); err != nil {
		return err
	}
	return t.s.db.Ingest(ctx, []string{t.path})
}

// abort drops a table being built (its file goes with the directory).
func (t *tableBuilder) abort() {
	if t.w != nil {
		_ = t.w.Close()
		t.w = nil
	}
}
