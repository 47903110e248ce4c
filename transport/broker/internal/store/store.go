package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Errors returned by the store. Match them with errors.Is.
var (
	// ErrClosed is returned by every call made after Close started.
	ErrClosed = errors.New("store: closed")
	// ErrInvalid is returned for arguments that violate a documented bound.
	ErrInvalid = errors.New("store: invalid argument")
	// ErrNotFound is returned when a requested message or value does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrCorrupt is returned when stored data does not decode.
	ErrCorrupt = errors.New("store: corrupt data")
	// ErrFailed is returned by writes after a write or fsync to Pebble
	// failed: the store is fail-stop (a failed fsync is never retried, since
	// the kernel may have dropped the dirty pages it could not write). Reads
	// keep working; the store must be closed and reopened, which recovers
	// the state that was durable.
	ErrFailed = errors.New("store: failed")
	// ErrDiskFull is returned by Put and PutAsync while the disk holding the
	// store is used above Options.DiskHighWatermark; writes are accepted
	// again by themselves once usage falls below it.
	ErrDiskFull = errors.New("store: disk usage above the high-water mark")
)

// Fixed positions in a stored record (protocol doc §4.1).
const (
	posTotalSize   = 0
	posQueueOffset = 20
	posPhysOffset  = 28
	// minRecordLen is the smallest record the store accepts: it must hold
	// every field up to and including PHYSICALOFFSET.
	minRecordLen = posPhysOffset + 8
	// minStoreTimestampPos is the lowest accepted STORETIMESTAMP position
	// (after SYSFLAG and BORNTIMESTAMP; 56 for an IPv4 born host).
	minStoreTimestampPos = 56
)

// Limits on caller-supplied values.
const (
	// MaxNameLen bounds topic, group and index key lengths in bytes.
	MaxNameLen = 1024
	// MaxKeysPerMessage bounds PutMessage.Keys.
	MaxKeysPerMessage = 128
	// MaxPutBytes bounds the total record bytes of one Put call.
	MaxPutBytes = 256 << 20
	// MaxValueLen bounds config and meta values.
	MaxValueLen = 64 << 20
	// MaxMetaKeyLen bounds meta keys.
	MaxMetaKeyLen = 4096
	// MaxScanPerGet bounds the entries one Get call scans (matching or not),
	// so a selective filter cannot make a pull read a whole queue.
	MaxScanPerGet = 16384
	// MaxQueryNum bounds QueryByKey results.
	MaxQueryNum = 1024
)

// FlushMode selects when Put returns relative to fsync.
type FlushMode int

const (
	// FlushSync (default): Put returns after the WAL holding its messages was
	// fsynced. Concurrent Puts share one fsync (group commit).
	FlushSync FlushMode = iota
	// FlushAsync: Put returns once its messages are applied (readable); the
	// WAL is fsynced in the background every Options.SyncInterval. A machine
	// crash or power loss can lose the Puts of the last SyncInterval (plus
	// the time of one fsync). A process crash (kill -9) can lose what Pebble
	// had not yet handed to the OS: its WAL writer keeps the current 32 KiB
	// block in memory until the block fills or the next background sync, so
	// at most about 32 KiB of records, all acknowledged within the last
	// SyncInterval (RocketMQ's ASYNC flush, writing to the page cache, loses
	// nothing on a process crash). Lost messages' offsets are reused after
	// restart.
	//
	// A failed WAL write or fsync (disk full, I/O error) makes the store
	// fail, as in FlushSync mode: writes get ErrFailed from then on (also
	// the Puts of a round that raced with the failure), reads keep working.
	// Puts acknowledged before the failure since the last successful fsync
	// may be lost, as in a machine crash. Pebble cannot unwind a WAL
	// failure hit while it switches to a new WAL file (once per memtable,
	// 64 MiB of writes by default): that one still ends the process, in
	// both modes.
	FlushAsync
)

// String returns "sync" or "async".
func (m FlushMode) String() string {
	switch m {
	case FlushSync:
		return "sync"
	case FlushAsync:
		return "async"
	default:
		return fmt.Sprintf("FlushMode(%d)", int(m))
	}
}

// Notifier is called by the committer goroutine after a Put round was
// published (durable in SYNC mode, applied in ASYNC mode), once per queue
// written in that round, with the queue's new max offset. It runs on the
// committer goroutine while the append lock is held: it must return quickly,
// must not block, and must not call Put, TruncateBefore or DeleteTopic.
type Notifier func(topic string, queue int32, maxOffset int64)

// Options configure Open. The zero value is valid.
type Options struct {
	// FlushMode selects SYNC (default) or ASYNC durability for Put.
	FlushMode FlushMode
	// SyncInterval is the background fsync period in ASYNC mode
	// (default 500ms, like RocketMQ's flushIntervalCommitLog).
	SyncInterval time.Duration
	// Logger receives Pebble's log output and store events; nil discards.
	Logger *slog.Logger
	// MaxBatchBytes is the record volume after which the committer stops
	// collecting more Put calls into one batch (default 4 MiB). A single Put
	// is never split.
	MaxBatchBytes int
	// MaxRecordBytes bounds one record (default 8 MiB).
	MaxRecordBytes int
	// Clock supplies store timestamps (default time.Now); for tests.
	Clock func() time.Time
	// Notify, if set, is called after new messages become readable.
	Notify Notifier
	// DiskHighWatermark, when in (0, 1), makes Put and PutAsync fail with
	// ErrDiskFull while the file system holding the store is used above
	// this fraction (used / (used + available), df's Use%). Usage is read
	// with statfs at Open and every DiskCheckInterval; in between, the
	// bytes of accepted Puts are added to the last reading, so a burst cannot
	// run far past the mark. 0 (the default) or 1 turns the check off.
	DiskHighWatermark float64
	// DiskCheckInterval is the period of the disk usage check (default 1s).
	DiskCheckInterval time.Duration
	// DiskUsage, if set, replaces statfs on the store's directory (for
	// tests): it returns the bytes available to the store and the capacity
	// (used + available).
	DiskUsage func() (avail, total uint64, err error)
	// PebbleOptions, if non-nil, is used as the base Pebble configuration
	// (the store sets Logger, and MemTableSize, MemTableStopWritesThreshold,
	// CacheSize, L0CompactionThreshold, L0StopWritesThreshold and the block
	// size of levels 1-6 where they are zero). Ownership passes to Open.
	PebbleOptions *pebble.Options
}

func (o *Options) setDefaults() error {
	if o.FlushMode != FlushSync && o.FlushMode != FlushAsync {
		return fmt.Errorf("%w: flush mode %d", ErrInvalid, o.FlushMode)
	}
	if o.SyncInterval < 0 || o.MaxBatchBytes < 0 || o.MaxRecordBytes < 0 || o.DiskCheckInterval < 0 {
		return fmt.Errorf("%w: negative option", ErrInvalid)
	}
	if !(o.DiskHighWatermark >= 0 && o.DiskHighWatermark <= 1) { // also NaN
		return fmt.Errorf("%w: disk high-water mark %v outside [0, 1]", ErrInvalid, o.DiskHighWatermark)
	}
	if o.DiskCheckInterval == 0 {
		o.DiskCheckInterval = time.Second
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = 500 * time.Millisecond
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = 4 << 20
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 8 << 20
	}
	if o.MaxRecordBytes < minRecordLen || o.MaxRecordBytes > MaxPutBytes {
		return fmt.Errorf("%w: MaxRecordBytes %d", ErrInvalid, o.MaxRecordBytes)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// queueKey identifies a queue in the in-memory map.
type queueKey struct {
	topic string
	id    int32
}

// queue is the in-memory state of one (topic, queue id).
type queue struct {
	topic   string
	id      int32
	metaKey []byte // immutable

	// next is the next offset to assign; guarded by Store.writeMu.
	next int64
	// touched marks the queue as written in the current round; writeMu.
	touched bool
	// round and count are the queue's index among the round's touched
	// queues and its message count in the round, for ordering; writeMu.
	round, count int32

	// max is the published max offset (next offset readers may see).
	max atomic.Int64
	// min is the smallest offset still stored (== max when empty).
	min atomic.Int64
}

// Store is a durable message store. All methods are safe for concurrent use.
type Store struct {
	db   *pebble.DB
	opts Options
	log  *slog.Logger

	reqs chan *putRequest
	// queued counts the Put and PutAsync calls queued for the committer or
	// in its current round (PutAsyncInline commits inline only at zero).
	queued atomic.Int64
	quit   chan struct{}
	wg     sync.WaitGroup

	reqPool sync.Pool // *putRequest
	bounds  sync.Pool // *bounds

	// writeMu is the append lock: held by the committer for a round and by
	// TruncateBefore/DeleteTopic.
	writeMu sync.Mutex
	// walMu serializes every write to Pebble from the failure check to the
	// end of its WAL append (commitBatch), so that no write reaches Pebble's
	// WAL writer once it holds an error (walfs.go). Not held while waiting
	// for an fsync.
	walMu    sync.Mutex
	physNext int64          // writeMu
	lastTS   int64          // writeMu
	touched  []*queue       // writeMu; scratch
	refs     []msgRef       // writeMu; scratch
	sorted   []msgRef       // writeMu; scratch
	inline   [1]*putRequest // writeMu; PutAsyncInline's round

	// physPublished bounds physical offsets readers may resolve.
	physPublished atomic.Int64
	failure       atomic.Pointer[failure]
	disk          diskGuard // disk.go
	syncs         atomic.Int64
	rounds        atomic.Int64
	dirty         atomic.Bool

	qmu struct {
		sync.RWMutex
		m map[queueKey]*queue
	}

	mu struct {
		sync.Mutex
		closed bool
		active int
		idle   sync.Cond
	}
}

// Open opens (creating if needed) the store in dir, recovers the in-memory
// counters and starts the committer (and, in ASYNC mode, the syncer)
// goroutines, which Close joins.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	po := opts.PebbleOptions
	if po == nil {
		po = &pebble.Options{}
	}
	// A message log writes sequentially and reads mostly recent data: a
	// large memtable absorbs bursts and keeps recent messages in memory.
	if po.MemTableSize == 0 {
		po.MemTableSize = 64 << 20
	}
	if po.MemTableStopWritesThreshold == 0 {
		po.MemTableStopWritesThreshold = 4
	}
	if po.Cache == nil && po.CacheSize == 0 {
		po.CacheSize = 64 << 20
	}
	// Compactions out of L0 rewrite the overlapping part of Lbase, and a
	// flush of messages overlaps nearly all of it (every queue's range and
	// the key index get new keys in every memtable): with Pebble's default
	// threshold of 4, L0 compactions were the store's largest CPU cost (a
	// sixth of an exactly-once ETL run). Pebble scores L0 as twice its
	// sublevel count over the threshold and compacts it from a score of 1:
	// a threshold of 8 lets 4 sublevels build up (the default, 2), which
	// halves how often Lbase is rewritten; reads mostly hit recent data
	// (memtable and the newest sublevels). Writes stop at 3x the threshold
	// in sublevels, as with Pebble's defaults (4 and 12).
	if po.L0CompactionThreshold == 0 {
		po.L0CompactionThreshold = 8
	}
	if po.L0StopWritesThreshold == 0 {
		po.L0StopWritesThreshold = 3 * po.L0CompactionThreshold
	}
	// 32 KiB data blocks (Pebble's default is 4 KiB) below L0: a
	// compaction pays per block (compression call, checksum, index entry
	// and a write to the file), messages are hundreds of bytes to a few
	// KiB, and pulls read them in sequence. L0, written by flushes, keeps
	// the default: with 32 KiB there too, TestSendDiskFullTmpfs saw the
	// disk-full state clear by itself after the refusals (2 of 27 runs;
	// cause not found), and the measured gain is in compactions.
	for i := 1; i < len(po.Levels); i++ {
		if po.Levels[i].BlockSize == 0 {
			po.Levels[i].BlockSize = 32 << 10
		}
	}
	po.Logger = pebbleLogger{opts.Logger}
	s := &Store{
		opts: opts,
		log:  opts.Logger,
		reqs: make(chan *putRequest, putQueueLen),
		quit: make(chan struct{}),
	}
	if po.FS == nil {
		po.FS = vfs.Default
	}
	po.FS = walWatchFS{FS: po.FS, s: s}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("store: open pebble in %s: %w", dir, err)
	}
	s.db = db
	s.qmu.m = make(map[queueKey]*queue)
	s.mu.idle.L = &s.mu.Mutex
	s.reqPool.New = func() any { return &putRequest{done: make(chan error, 1)} }
	s.bounds.New = func() any { return new(bounds) }
	if err := s.recover(); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	if err := s.failedErr(); err != nil { // a WAL failure during recovery
		return nil, errors.Join(err, db.Close())
	}
	if err := s.disk.init(dir, &opts); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	s.wg.Add(1)
	go s.runCommitter()
	if s.disk.on {
		s.wg.Add(1)
		go s.runDiskCheck()
	}
	if opts.FlushMode == FlushAsync {
		s.wg.Add(1)
		go s.runSyncer()
	}
	return s, nil
}

// recover checks the format version and rebuilds the in-memory counters.
func (s *Store) recover() (err error) {
	defer s.recoverFatal(&err, "open")
	v, closer, err := s.db.Get(keyVersion)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		var v [4]byte
		binary.BigEndian.PutUint32(v[:], formatVersion)
		b := s.db.NewBatch()
		err := b.Set(keyVersion, v[:], nil)
		if err == nil {
			err = s.commitBatch(b, true, "write format version")
		}
		_ = b.Close()
		if err != nil {
			return fmt.Errorf("store: write format version: %w", err)
		}
	case err != nil:
		return fmt.Errorf("store: read format version: %w", err)
	default:
		ver := uint32(0)
		if len(v) == 4 {
			ver = binary.BigEndian.Uint32(v)
		}
		_ = closer.Close()
		if ver != formatVersion {
			return fmt.Errorf("%w: format version %d, want %d", ErrCorrupt, ver, formatVersion)
		}
	}

	// Physical counter and last timestamp.
	v, closer, err = s.db.Get(keyGlobal)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return fmt.Errorf("store: read global meta: %w", err)
	default:
		if len(v) != 16 {
			_ = closer.Close()
			return fmt.Errorf("%w: global meta of %d bytes", ErrCorrupt, len(v))
		}
		s.physNext = int64(binary.BigEndian.Uint64(v))
		s.lastTS = int64(binary.BigEndian.Uint64(v[8:]))
		_ = closer.Close()
	}
	// Verify against the last physical index entry.
	if err := s.recoverPhys(); err != nil {
		return err
	}
	s.physPublished.Store(s.physNext)

	// Queues: persisted meta, then the message keys themselves.
	type qstate struct {
		metaNext, metaMin int64
		first, last       int64
		hasData           bool
	}
	states := make(map[queueKey]*qstate)
	get := func(k queueKey) *qstate {
		st := states[k]
		if st == nil {
			st = &qstate{}
			states[k] = st
		}
		return st
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixQueue}, UpperBound: []byte{prefixQueue + 1}})
	if err != nil {
		return fmt.Errorf("store: iterate queue meta: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		topic, qid, rest, err := parseQueueKey(it.Key())
		if err != nil || len(rest) != 0 {
			_ = it.Close()
			return errCorruptKey(it.Key())
		}
		val, err := it.ValueAndErr()
		if err != nil || len(val) != 16 {
			_ = it.Close()
			return fmt.Errorf("%w: queue meta for %s/%d", ErrCorrupt, topic, qid)
		}
		st := get(queueKey{topic, qid})
		st.metaNext = int64(binary.BigEndian.Uint64(val))
		st.metaMin = int64(binary.BigEndian.Uint64(val[8:]))
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: iterate queue meta: %w", err)
	}

	// Skip-scan the message keys: two seeks per queue.
	it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixMessage}, UpperBound: []byte{prefixMessage + 1}})
	if err != nil {
		return fmt.Errorf("store: iterate messages: %w", err)
	}
	for ok := it.First(); ok; {
		topic, qid, rest, err := parseQueueKey(it.Key())
		if err != nil || len(rest) != 8 {
			_ = it.Close()
			return errCorruptKey(it.Key())
		}
		st := get(queueKey{topic, qid})
		st.hasData = true
		st.first = msgKeyOffset(it.Key())
		end := prefixEnd(appendQueuePrefix(nil, prefixMessage, topic, qid))
		if !it.SeekLT(end) {
			_ = it.Close()
			return fmt.Errorf("store: iterate messages: %w", errors.Join(ErrCorrupt, it.Error()))
		}
		st.last = msgKeyOffset(it.Key())
		ok = it.SeekGE(end)
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: iterate messages: %w", err)
	}

	for k, st := range states {
		next := st.metaNext
		minOff := st.metaMin
		if st.hasData {
			// Commit rounds do not write the queue meta: the data has the
			// next offset, the meta only what TruncateBefore left.
			next = max(next, st.last+1)
			minOff = st.first
		} else {
			minOff = next
		}
		q := newQueue(k.topic, k.id)
		q.next = next
		q.max.Store(next)
		q.min.Store(minOff)
		s.qmu.m[k] = q
	}
	return nil
}

func (s *Store) recoverPhys() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPhys}, UpperBound: []byte{prefixPhys + 1}})
	if err != nil {
		return fmt.Errorf("store: iterate physical index: %w", err)
	}
	defer it.Close()
	if !it.Last() {
		return it.Error()
	}
	k := it.Key()
	v, err := it.ValueAndErr()
	if err != nil {
		return fmt.Errorf("store: read physical index: %w", err)
	}
	if len(k) != 9 || len(v) < physValueFixed {
		return fmt.Errorf("%w: physical index entry", ErrCorrupt)
	}
	end := int64(binary.BigEndian.Uint64(k[1:])) + int64(binary.BigEndian.Uint32(v))
	if end > s.physNext {
		// The usual case: commit rounds do not write the global meta.
		s.physNext = end
	}
	// The last store timestamp is that of the last message: timestamps
	// never decrease in physical order.
	queue := int32(binary.BigEndian.Uint32(v[4:]))
	off := int64(binary.BigEndian.Uint64(v[8:]))
	mv, closer, err := s.db.Get(appendMsgKey(nil, string(v[physValueFixed:]), queue, off))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		// DeleteTopic deletes physical index entries before their messages,
		// never after: not expected, and the global meta then holds the
		// timestamp anyway (written with every such deletion).
		return nil
	case err != nil:
		return fmt.Errorf("store: read last message: %w", err)
	}
	m, err := decodeValue(mv)
	_ = closer.Close()
	if err != nil {
		return fmt.Errorf("store: read last message: %w", err)
	}
	if m.storeTS > s.lastTS {
		s.lastTS = m.storeTS
	}
	return nil
}

func newQueue(topic string, id int32) *queue {
	return &queue{topic: topic, id: id, metaKey: appendQueuePrefix(nil, prefixQueue, topic, id)}
}

// acquire registers an in-flight call; it fails after Close started.
func (s *Store) acquire() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return ErrClosed
	}
	s.mu.active++
	return nil
}

func (s *Store) release() {
	s.mu.Lock()
	s.mu.active--
	if s.mu.active == 0 && s.mu.closed {
		s.mu.idle.Broadcast()
	}
	s.mu.Unlock()
}

// Close stops accepting calls, waits for in-flight calls, joins the
// committer and syncer goroutines, fsyncs the WAL (making consumer offsets
// and ASYNC-mode messages durable) and closes Pebble. Puts waiting to be
// collected fail with ErrClosed. Close is idempotent: later calls return nil.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	for s.mu.active > 0 {
		s.mu.idle.Wait()
	}
	s.mu.Unlock()
	close(s.quit)
	s.wg.Wait()
	// After a failure the WAL is not synced again: a failed fsync is never
	// retried, and Pebble's WAL writer keeps the error anyway.
	err := s.syncWAL("final sync")
	if cerr := s.db.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("store: close pebble: %w", cerr))
	}
	return err
}

// Syncs returns how many WAL fsyncs the store requested for message writes
// (one per committed round in SYNC mode, one per background sync in ASYNC
// mode). Safe for concurrent use; for tests and metrics.
func (s *Store) Syncs() int64 { return s.syncs.Load() }

// Rounds returns how many commit rounds (Pebble batches of Put calls) the
// committer ran; Put calls per round measure group commit. Safe for
// concurrent use; for tests and metrics.
func (s *Store) Rounds() int64 { return s.rounds.Load() }

// lookupQueue returns the queue or nil.
func (s *Store) lookupQueue(topic string, id int32) *queue {
	s.qmu.RLock()
	q := s.qmu.m[queueKey{topic, id}]
	s.qmu.RUnlock()
	return q
}

// runSyncer fsyncs the WAL periodically in ASYNC mode.
func (s *Store) runSyncer() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
			if !s.dirty.Swap(false) {
				continue
			}
			if err := s.syncWAL("background sync"); err != nil {
				return
			}
			s.syncs.Add(1)
		}
	}
}

// syncWAL fsyncs Pebble's WAL unless the store failed; a failure makes
// the store fail.
func (s *Store) syncWAL(what string) error {
	if err := s.failedErr(); err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.LogData(nil, nil); err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return s.commitBatch(b, true, what)
}

// commitBatch commits b to Pebble; every store write goes through it.
// With sync it returns once the WAL holding b was fsynced.
//
// Fail-stop: nothing is written once the store failed, and any failure, a
// returned error, Pebble's fatal commit error (pebbleLogger.Fatalf) or a
// failed WAL write or fsync seen by walWatchFS while b was committed, makes
// the store fail and is returned (wrapping ErrFailed): the write is never
// retried, and a write that raced with a WAL failure is reported failed
// even though Pebble applied it (in ASYNC mode it may be lost).
//
// The failure check and Pebble's WAL append happen under walMu: Pebble's
// WAL writer panics on the append after it kept a background error, and
// walWatchFS marks the store failed before Pebble sees the error, so the
// next append checks and refuses instead. The fsync is waited for outside
// walMu, so concurrent writers still share fsyncs.
func (s *Store) commitBatch(b *pebble.Batch, sync bool, what string) error {
	s.walMu.Lock()
	err := s.applyLocked(b, sync, what)
	s.walMu.Unlock()
	if err == nil && sync {
		if serr := b.SyncWait(); serr != nil {
			err = s.fail(what, serr)
		}
	}
	if err == nil {
		err = s.failedErr()
	}
	return err
}

// applyLocked appends b to the WAL and applies it, without waiting for the
// fsync. Requires walMu.
func (s *Store) applyLocked(b *pebble.Batch, sync bool, what string) (err error) {
	if err := s.failedErr(); err != nil {
		return err
	}
	defer s.recoverFatal(&err, what)
	if sync {
		err = s.db.ApplyNoSyncWait(b, pebble.Sync)
	} else {
		err = s.db.Apply(b, pebble.NoSync)
	}
	if err != nil {
		return s.fail(what, err)
	}
	return nil
}

// walFailed makes the store fail because a WAL write or fsync failed (what
// says which); called by walWatchFS on Pebble's goroutines.
func (s *Store) walFailed(what string, err error) {
	s.setFailed(fmt.Errorf("store: %s: %w", what, err))
}

// fail makes the store fail because of err, a failed write to Pebble, and
// returns the sticky failure (wrapping ErrFailed).
func (s *Store) fail(what string, err error) error {
	s.setFailed(fmt.Errorf("store: %s: %w", what, err))
	return s.failedErr()
}

// recoverFatal, deferred around a write to Pebble, turns Pebble's fatal
// commit error (see pebbleLogger.Fatalf) into a store failure assigned to
// *err. Other panics are re-raised.
//
// Pebble reports a failed WAL write or fsync of a committed batch through
// Logger.Fatalf, after its commit pipeline has released the batch (no Pebble
// lock is held), so unwinding to here is safe; the store then never writes
// to Pebble again (fail-stop) and Close releases it.
func (s *Store) recoverFatal(err *error, what string) {
	r := recover()
	if r == nil {
		return
	}
	pf, ok := r.(pebbleFatal)
	if !ok {
		panic(r)
	}
	*err = s.fail(what, pf.err)
}

// pebbleFatal is the panic value of pebbleLogger.Fatalf.
type pebbleFatal struct{ err error }

// failure is a sticky write failure.
type failure struct{ err error }

// setFailed records a sticky write failure; the first one wins.
func (s *Store) setFailed(err error) {
	if s.failure.CompareAndSwap(nil, &failure{err}) {
		s.log.Error("store: write failed; store refuses further writes", "err", err)
	}
}

// failedErr returns the sticky failure, if any, wrapped in ErrFailed.
func (s *Store) failedErr() error {
	if f := s.failure.Load(); f != nil {
		return fmt.Errorf("%w: %w", ErrFailed, f.err)
	}
	return nil
}

// pebbleLogger adapts slog to Pebble's logger.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l.Enabled(context.Background(), slog.LevelDebug) {
		p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf must not return (Pebble's contract). Pebble calls it on a failed
// commit (WAL write or fsync error, e.g. disk full) and on unrecoverable
// internal errors. It panics with a pebbleFatal, which the store's write
// paths recover (recoverFatal) to fail the store instead of the process;
// on Pebble's own goroutines the panic ends the process (fail-stop).
func (p pebbleLogger) Fatalf(format string, args ...any) {
	err := &fatalError{msg: "pebble fatal: " + fmt.Sprintf(format, args...)}
	for _, a := range args {
		if e, ok := a.(error); ok {
			err.cause = e // keeps the cause (an errno…) matchable
			break
		}
	}
	p.l.Error(err.msg, "component", "pebble")
	panic(pebbleFatal{err})
}

// fatalError is the error Pebble reported through Fatalf.
type fatalError struct {
	msg   string
	cause error
}

func (e *fatalError) Error() string { return e.msg }
func (e *fatalError) Unwrap() error { return e.cause }
