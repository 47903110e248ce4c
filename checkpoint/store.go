package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/runnel-dev/runnel/checkpoint/internal/storefs"
)

// FormatVersion is the on-disk format this build writes. Stores and
// savepoints record the version that wrote them; Open ratchets an older store
// forward and refuses a newer one with ErrFormatTooNew.
const FormatVersion uint32 = 1

// Options configure a Store. The zero value is usable: Retain defaults to 3
// and an empty Fingerprint skips the fingerprint check (inspection tools).
type Options struct {
	// Logger receives the store's few log lines; nil discards them.
	Logger *slog.Logger
	// Retain is how many completed checkpoints' metadata are kept for
	// inspection (History). Restore is always from the latest; older
	// checkpoints are kept portable as savepoints. Default 3, minimum 1.
	Retain int
	// Fingerprint describes the running job. Open compares it with the one
	// stored with the latest completed checkpoint and fails with
	// ErrFingerprintMismatch when an operator's kind or codecs changed, an
	// operator that has committed state disappeared, or MaxParallelism
	// changed. Operators new to the job are fine (they start empty). A zero
	// Fingerprint skips the check. Commit stores it with every checkpoint.
	Fingerprint Fingerprint
	// MemTableSize bounds Pebble's memtable (default 64 MiB).
	MemTableSize uint64
	// RotateMemTableAt, when above 0, makes a Commit of at least that many
	// entries (state changes, offsets, metadata) start a new memtable
	// first, unless the memtable it started last time is still being
	// flushed. A sorted batch inserts into an empty memtable at about a
	// pointer update per key, but at a full skiplist search per key into
	// one that holds the previous checkpoints' versions of the same keys:
	// at 100k changed keys that insert is most of the commit. The price
	// is a background flush per large checkpoint, which costs more CPU in
	// all when checkpoints rewrite the same keys (one memtable would
	// have deduplicated them): it trades throughput for commit latency.
	// RecommendedRotateMemTableAt is a sensible value. 0 (the default)
	// leaves rotation to Pebble.
	RotateMemTableAt int
	// FS runs the store on a Pebble virtual filesystem. Only packages under
	// checkpoint/ can build one (crash tests); leave nil for the OS's files.
	FS *storefs.FS
	// KeepCopies is how many retained, restorable copies of completed
	// checkpoints KeepCopy keeps (retain.go); the oldest beyond it are
	// removed. 0 keeps none (the latest checkpoint is always restorable).
	KeepCopies int
	// readOnly opens a retained copy for reading (retain.go).
	readOnly bool
}

// Fingerprint identifies a job's state layout: changing it incompatibly makes
// restoring a checkpoint unsafe.
type Fingerprint struct {
	// MaxParallelism is the number of key groups.
	MaxParallelism int `json:"maxParallelism"`
	// Operators lists the job's operators (stateless ones may be left out).
	Operators []OperatorInfo `json:"operators"`
}

// OperatorInfo is one operator's entry in a Fingerprint.
type OperatorInfo struct {
	// UID is the operator's stable unique id (the key of its state).
	UID string `json:"uid"`
	// Kind names the operator type (e.g. "keyed-process", "reduce").
	Kind string `json:"kind"`
	// Codecs lists the state and key codec ids (state.Backend.Codecs).
	Codecs string `json:"codecs"`
}

// Metadata describes one completed checkpoint.
type Metadata struct {
	ID uint64 `json:"id"`
	// Prev is the id of the checkpoint this one followed (0 for a store's
	// first): ApplyBatch checks that a replica is at Prev before it replays
	// this checkpoint's batch.
	Prev          uint64      `json:"prev,omitempty"`
	Time          time.Time   `json:"time"`
	FormatVersion uint32      `json:"formatVersion"`
	Fingerprint   Fingerprint `json:"fingerprint"`
	// Bytes is the size of the committed batch.
	Bytes int64 `json:"bytes"`
	// Offsets is the number of offsets written (or deleted) by the checkpoint.
	Offsets int `json:"offsets"`
	// StateChanges counts the puts, deletes and range deletes of its parts.
	StateChanges int `json:"stateChanges"`
	// PendingCommits is the number of pending sink commits it added.
	PendingCommits int `json:"pendingCommits"`
	// Duration is the time Commit took to build the batch (the stored value);
	// the Metadata that Commit returns (and History in the same process)
	// includes the synced write.
	Duration time.Duration `json:"duration"`
	// Savepoint is set on the metadata written by RestoreSavepoint.
	Savepoint bool `json:"savepoint,omitempty"`
	// RestoredFrom is the id of the checkpoint or savepoint that
	// RestoreFrom restored as this checkpoint (0: none), Restore its spec.
	RestoredFrom uint64 `json:"restoredFrom,omitempty"`
	Restore      string `json:"restore,omitempty"`
	// Kind is "savepoint" for a checkpoint taken as a savepoint
	// (Commit.Kind), empty for a periodic one.
	Kind string `json:"kind,omitempty"`
}

// PendingCommit is a sink's pre-committed transaction recorded by a
// checkpoint: after a restart the sink commits every pending record the
// latest checkpoint lists (idempotently) and aborts anything else. Records
// stay listed until a later Commit names them in Resolved.
type PendingCommit struct {
	SinkUID      string `json:"sinkUID"`
	Subtask      int    `json:"subtask"`
	CheckpointID uint64 `json:"checkpointID"`
	Data         []byte `json:"data"`
}

// Store is a job's durable store: one Pebble database per job directory
// holding the committed state, source offsets, pending sink commits and
// checkpoint metadata. It is safe for concurrent use: reads run in parallel
// with each other and with Commit; Commit calls are serialised.
type Store struct {
	opts Options
	dir  string
	db   *pebble.DB
	log  *slog.Logger

	commitMu sync.Mutex // serialises Commit (held across the sync)
	mu       struct {
		sync.Mutex
		closed  bool
		failed  error      // a fatal Pebble error poisoned the store
		history []Metadata // newest first, at most opts.Retain
	}
	// writing is set while Commit builds its batch: Writers check it under
	// invariants (state reaches Pebble only through a checkpoint).
	writing bool
	// batch is Commit's batch, reset and reused by the next (guarded by
	// commitMu); nil before the first Commit.
	batch *pebble.Batch
	// sinceRotate counts the entries committed since Commit last made
	// Pebble rotate its memtable (guarded by commitMu; see
	// rotateForLargeBatch).
	sinceRotate int
	// flushing is closed when the memtable Commit rotated last has been
	// flushed (nil: no such flush pending).
	flushing <-chan struct{}
	// compactions runs requested range compactions (compact.go).
	compactions compactor
}

// Open opens (creating if needed) the store in dir. It reads only the format
// record and the retained metadata (no scan of state), ratchets an older
// format forward, and checks opts.Fingerprint against the latest completed
// checkpoint (see Options.Fingerprint).
func Open(dir string, opts Options) (*Store, error) {
	s, err := open(dir, opts)
	if err != nil {
		return nil, err
	}
	if err := s.checkRestoring(); err != nil {
		_ = s.db.Close()
		return nil, err
	}
	if err := s.checkFingerprint(); err != nil {
		_ = s.db.Close()
		return nil, err
	}
	return s, nil
}

// open opens the database, checks the format and loads the history.
func open(dir string, opts Options) (*Store, error) {
	if opts.Retain <= 0 {
		opts.Retain = 3
	}
	if opts.MemTableSize == 0 {
		opts.MemTableSize = 64 << 20
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	popts := &pebble.Options{
		MemTableSize:       opts.MemTableSize,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{log},
		ReadOnly:           opts.readOnly,
	}
	if opts.FS != nil && opts.FS.VFS != nil {
		popts.FS = opts.FS.VFS
	} else {
		popts.FS = vfs.Default
	}
	db, err := pebble.Open(dir, popts)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open %s: %w", dir, err)
	}
	s := &Store{opts: opts, dir: dir, db: db, log: log}
	if opts.readOnly {
		if err := s.loadHistory(); err != nil {
			_ = db.Close()
			return nil, err
		}
		return s, nil
	}
	if err := s.checkFormat(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.loadHistory(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) get(key []byte) ([]byte, bool, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint: read: %w", err)
	}
	out := append([]byte(nil), v...)
	return out, true, closer.Close()
}

// checkFormat reads the format record: a new store gets FormatVersion, an
// older one is ratcheted forward, a newer one is refused.
func (s *Store) checkFormat() error {
	v, ok, err := s.get(keyFormat)
	if err != nil {
		return err
	}
	if ok {
		if len(v) != 4 {
			return fmt.Errorf("%w: format record of %d bytes", ErrCorrupt, len(v))
		}
		stored := binary.BigEndian.Uint32(v)
		switch {
		case stored > FormatVersion:
			return fmt.Errorf("%w: store has format %d, this build reads up to %d", ErrFormatTooNew, stored, FormatVersion)
		case stored == FormatVersion:
			return nil
		}
		s.log.Info("checkpoint: ratcheting store format", "from", stored, "to", FormatVersion)
	} else {
		// A store without a format record must be empty: anything else was
		// not written by this package.
		it, err := s.db.NewIter(nil)
		if err != nil {
			return fmt.Errorf("checkpoint: read: %w", err)
		}
		nonEmpty := it.First()
		if err := it.Close(); err != nil {
			return fmt.Errorf("checkpoint: read: %w", err)
		}
		if nonEmpty {
			return fmt.Errorf("%w: store has data but no format record", ErrCorrupt)
		}
	}
	if err := s.db.Set(keyFormat, binary.BigEndian.AppendUint32(nil, FormatVersion), pebble.Sync); err != nil {
		return fmt.Errorf("checkpoint: write format: %w", err)
	}
	return nil
}

func (s *Store) checkRestoring() error {
	_, ok, err := s.get(keyRestoring)
	if err != nil {
		return err
	}
	if ok {
		return ErrIncompleteRestore
	}
	return nil
}

// loadHistory reads the latest pointer and the retained metadata.
func (s *Store) loadHistory() error {
	v, ok, err := s.get(keyLatest)
	if err != nil || !ok {
		return err
	}
	if len(v) != 8 {
		return fmt.Errorf("%w: latest pointer of %d bytes", ErrCorrupt, len(v))
	}
	latest := binary.BigEndian.Uint64(v)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{famMeta}, UpperBound: metaKey(latest + 1)})
	if err != nil {
		return fmt.Errorf("checkpoint: read: %w", err)
	}
	var hist []Metadata
	for valid := it.Last(); valid && len(hist) < s.opts.Retain; valid = it.Prev() {
		var m Metadata
		if err := json.Unmarshal(it.Value(), &m); err != nil {
			_ = it.Close()
			return fmt.Errorf("%w: metadata %x: %w", ErrCorrupt, it.Key(), err)
		}
		hist = append(hist, m)
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("checkpoint: read: %w", err)
	}
	if len(hist) == 0 || hist[0].ID != latest {
		return fmt.Errorf("%w: latest pointer %d has no metadata", ErrCorrupt, latest)
	}
	if hist[0].FormatVersion > FormatVersion {
		return fmt.Errorf("%w: checkpoint %d has format %d", ErrFormatTooNew, latest, hist[0].FormatVersion)
	}
	s.mu.history = hist
	return nil
}

func (s *Store) checkFingerprint() error {
	latest, ok := s.Latest()
	if !ok || s.opts.Fingerprint.IsZero() {
		return nil
	}
	d := diffFingerprints(latest.Fingerprint, s.opts.Fingerprint)
	// An operator that left the job without committed state is no loss.
	for uid, why := range d.ops {
		if why != "not in the job" {
			continue
		}
		has, err := s.hasState(uid, latest.Fingerprint.MaxParallelism)
		if err != nil {
			return err
		}
		if !has {
			delete(d.ops, uid)
		}
	}
	return d.err(fmt.Sprintf("checkpoint %d", latest.ID), nil)
}

// hasState reports whether uid has committed state in any key group below
// maxParallelism (one seek per key group).
func (s *Store) hasState(uid string, maxParallelism int) (bool, error) {
	found := false
	for kg := 0; kg < maxParallelism && kg <= 0xffff && !found; kg++ {
		err := s.ScanState(uid, uint16(kg), nil, func(_, _ []byte) bool {
			found = true
			return false
		})
		if err != nil {
			return false, err
		}
	}
	return found, nil
}

// Close flushes the memtable (so that the next Open replays no log) and
// closes the store. It is idempotent and safe to call concurrently; it waits
// for a Commit in progress.
func (s *Store) Close() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	failed := s.mu.failed
	s.mu.Unlock()
	s.stopCompactions() // compact.go
	if s.batch != nil {
		_ = s.batch.Close() // an empty, reset batch: nothing to report
		s.batch = nil
	}
	if failed != nil {
		// Pebble's state after a fatal error is undefined: release what can
		// be released and report the failure.
		_ = closeQuietly(s.db)
		return fmt.Errorf("%w: %w", ErrFailed, failed)
	}
	var ferr error
	if !s.opts.readOnly {
		ferr = s.db.Flush()
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("checkpoint: close: %w", err)
	}
	if ferr != nil {
		return fmt.Errorf("checkpoint: flush at close: %w", ferr)
	}
	return nil
}

func (s *Store) closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.closed
}

// closeQuietly closes a database after a fatal error, absorbing a repeated
// fatal panic.
func closeQuietly(db *pebble.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(*fatalError); ok {
				err = f
				return
			}
			panic(r)
		}
	}()
	return db.Close()
}

// Latest returns the last completed checkpoint; false when there is none.
func (s *Store) Latest() (Metadata, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.mu.history) == 0 {
		return Metadata{}, false
	}
	return s.mu.history[0], true
}

// History returns the retained completed checkpoints, newest first.
func (s *Store) History() []Metadata {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Metadata(nil), s.mu.history...)
}

// Offsets returns the source offsets as of the latest completed checkpoint,
// keyed by SplitKey(sourceUID, splitID).
func (s *Store) Offsets() (map[string][]byte, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	out := map[string][]byte{}
	err := s.scan(s.db, []byte{famOffset}, []byte{famOffset + 1}, func(k, v []byte) error {
		out[string(k[1:])] = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// PendingCommits returns the sink pre-commits that the latest completed
// checkpoint lists as not known to be resolved, ordered by (SinkUID,
// Subtask, CheckpointID).
func (s *Store) PendingCommits() ([]PendingCommit, error) {
	if s.closed() {
		return nil, ErrClosed
	}
	var out []PendingCommit
	err := s.scan(s.db, []byte{famPending}, []byte{famPending + 1}, func(k, v []byte) error {
		p, err := parsePendingKey(k)
		if err != nil {
			return err
		}
		p.Data = append([]byte(nil), v...)
		out = append(out, p)
		return nil
	})
	return out, err
}

type reader interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

// scan calls fn for every key in [lower, upper) of r.
func (s *Store) scan(r reader, lower, upper []byte, fn func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("checkpoint: read: %w", err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(it.Key(), v)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("checkpoint: read: %w", err)
	}
	return nil
}

// SplitKey is the Offsets key of one source split.
func SplitKey(sourceUID, splitID string) string { return sourceUID + "\x00" + splitID }

// GetState returns the committed value of (operatorUID, keyGroup, key). The
// returned slice is the caller's.
func (s *Store) GetState(operatorUID string, keyGroup uint16, key []byte) ([]byte, bool, error) {
	r := s.NewStateReader(operatorUID)
	return r.AppendValue(nil, keyGroup, key)
}

// ScanState calls fn for each committed entry of (operatorUID, keyGroup) whose
// key starts with prefix, in key order, until fn returns false. key and value
// are valid only during the call.
func (s *Store) ScanState(operatorUID string, keyGroup uint16, prefix []byte, fn func(key, value []byte) bool) error {
	return s.NewStateReader(operatorUID).Scan(keyGroup, prefix, fn)
}

// NewStateReader returns a reader of one operator's committed state with its
// own scratch buffer: the allocation-light path the state package uses. A
// StateReader is for one goroutine at a time; it is valid until the Store
// closes.
func (s *Store) NewStateReader(operatorUID string) *StateReader {
	return &StateReader{s: s, uid: operatorUID}
}

// StateReader reads one operator's committed state (see NewStateReader).
type StateReader struct {
	s   *Store
	uid string
	buf []byte
}

// AppendValue appends the committed value of (keyGroup, key) to dst and
// reports whether it exists.
func (r *StateReader) AppendValue(dst []byte, keyGroup uint16, key []byte) ([]byte, bool, error) {
	if err := checkUID(r.uid); err != nil {
		return dst, false, err
	}
	r.buf = append(appendStatePrefix(r.buf[:0], r.uid, keyGroup), key...)
	v, closer, err := r.s.db.Get(r.buf)
	if errors.Is(err, pebble.ErrNotFound) {
		return dst, false, nil
	}
	if err != nil {
		if r.s.closed() {
			return dst, false, ErrClosed
		}
		return dst, false, fmt.Errorf("checkpoint: read state: %w", err)
	}
	dst = append(dst, v...)
	return dst, true, closer.Close()
}

// Scan calls fn for each committed entry of keyGroup whose key starts with
// prefix, in key order, until fn returns false. key and value are valid only
// during the call.
func (r *StateReader) Scan(keyGroup uint16, prefix []byte, fn func(key, value []byte) bool) error {
	if err := checkUID(r.uid); err != nil {
		return err
	}
	if r.s.closed() {
		return ErrClosed
	}
	lower := append(appendStatePrefix(nil, r.uid, keyGroup), prefix...)
	hdr := len(lower) - len(prefix)
	err := r.s.scan(r.s.db, lower, prefixEnd(lower), func(k, v []byte) error {
		if !fn(k[hdr:], v) {
			return errStopScan
		}
		return nil
	})
	if errors.Is(err, errStopScan) {
		return nil
	}
	return err
}

// pebbleLogger routes Pebble's log lines to slog.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is called by Pebble on unrecoverable errors (a failed log write
// during a commit, corruption) and must not return. It panics with a
// *fatalError: Commit recovers it into ErrFailed and poisons the store;
// elsewhere (Pebble's background work) it ends the process, as Pebble's
// own logger would.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	err := &fatalError{err: fmt.Errorf(format, args...)}
	p.l.Error(err.Error())
	panic(err)
}

type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }
func (f *fatalError) Unwrap() error { return f.err }

// errStopScan ends a scan early; it never leaves the package.
var errStopScan = errors.New("checkpoint: scan stopped")

// StateIter iterates over one operator's committed state in a key group, in
// key order, from a consistent view taken when it was created. It is for
// one goroutine and must be closed.
type StateIter struct {
	it    *pebble.Iterator
	hdr   int
	lower []byte
	valid bool
}

// NewIter returns an iterator over the committed entries of keyGroup whose
// keys start with prefix, positioned at the first one.
func (r *StateReader) NewIter(keyGroup uint16, prefix []byte) (*StateIter, error) {
	if err := checkUID(r.uid); err != nil {
		return nil, err
	}
	if r.s.closed() {
		return nil, ErrClosed
	}
	lower := append(appendStatePrefix(nil, r.uid, keyGroup), prefix...)
	it, err := r.s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read state: %w", err)
	}
	si := &StateIter{it: it, hdr: len(lower) - len(prefix), lower: lower}
	si.valid = it.First()
	return si, nil
}

// SeekGE moves to the first entry whose key (without the operator and key
// group) is at or after key, and reports whether there is one.
func (si *StateIter) SeekGE(key []byte) bool {
	k := append(si.lower[:si.hdr:si.hdr], key...)
	si.valid = si.it.SeekGE(k)
	return si.valid
}

// Valid reports whether the iterator is at an entry.
func (si *StateIter) Valid() bool { return si.valid }

// Key returns the current entry's key (without the operator and key group),
// valid until the iterator moves.
func (si *StateIter) Key() []byte { return si.it.Key()[si.hdr:] }

// Value returns the current entry's value, valid until the iterator moves.
func (si *StateIter) Value() ([]byte, error) {
	v, err := si.it.ValueAndErr()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read state: %w", err)
	}
	return v, nil
}

// Next moves to the next entry and reports whether there is one.
func (si *StateIter) Next() bool {
	si.valid = si.it.Next()
	return si.valid
}

// Close releases the iterator and returns any iteration error.
func (si *StateIter) Close() error {
	if err := si.it.Close(); err != nil {
		return fmt.Errorf("checkpoint: read state: %w", err)
	}
	return nil
}
