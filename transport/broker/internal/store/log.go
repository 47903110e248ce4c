package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// The log, for replication (see "Replication" in the package doc).

// ErrLogConflict is returned by AppendLog for an entry that does not extend
// the log: its physical offset below the log end, or its queue offset below
// its queue's next offset, or its record's offset fields not matching.
var ErrLogConflict = errors.New("store: replicated entry conflicts with the log")

// LogEntry is one message of the log. ReadLog hands out entries whose
// Record and keys alias Pebble's memory, valid only during the callback;
// AppendLog takes entries whose Record the caller owns.
type LogEntry struct {
	// Phys is the record's physical offset; the record's PHYSICALOFFSET
	// field holds the same value.
	Phys int64
	// Topic, QueueID and QueueOffset are the record's queue position
	// (QUEUEOFFSET holds QueueOffset).
	Topic       string
	QueueID     int32
	QueueOffset int64
	// Record is the stored record.
	Record []byte
	// TagsCode and StoreTimestamp are the consume queue's data.
	TagsCode       int64
	StoreTimestamp int64
	// Keys are the key index entries' keys (AppendLog).
	Keys []string

	rawKeys []byte // ReadLog: the stored key list
}

// KeyCount returns how many index keys an entry of ReadLog has.
func (e *LogEntry) KeyCount() int {
	if e.rawKeys == nil {
		return len(e.Keys)
	}
	n := 0
	_ = forEachKey(e.rawKeys, func([]byte) { n++ })
	return n
}

// ForEachKey calls fn with each index key of the entry (the slice aliases
// the store's memory for an entry of ReadLog: copy it to keep it).
func (e *LogEntry) ForEachKey(fn func(k []byte)) {
	if e.rawKeys == nil {
		for _, k := range e.Keys {
			fn([]byte(k))
		}
		return
	}
	_ = forEachKey(e.rawKeys, fn)
}

// LogEnd returns the end of the published log: the physical offset the
// next record gets.
func (s *Store) LogEnd() int64 { return s.physPublished.Load() }

// LogStart returns the physical offset of the first record still stored,
// or LogEnd when the log holds none.
func (s *Store) LogStart() (int64, error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.release()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPhys}, UpperBound: []byte{prefixPhys + 1}})
	if err != nil {
		return 0, fmt.Errorf("store: log start: %w", err)
	}
	defer it.Close()
	if !it.First() {
		return s.LogEnd(), it.Error()
	}
	return min(int64(binary.BigEndian.Uint64(it.Key()[1:])), s.LogEnd()), nil
}

// RecordCovering reports the record that starts before off and ends after
// it, if any: off is then inside a record, not at a record boundary.
func (s *Store) RecordCovering(off int64) (start, end int64, ok bool, err error) {
	if err := s.acquire(); err != nil {
		return 0, 0, false, err
	}
	defer s.release()
	var kb [9]byte
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPhys}, UpperBound: appendPhysKey(kb[:0], off)})
	if err != nil {
		return 0, 0, false, fmt.Errorf("store: log: %w", err)
	}
	defer it.Close()
	if !it.Last() {
		return 0, 0, false, it.Error()
	}
	v, err := it.ValueAndErr()
	if err != nil || len(v) < physValueFixed {
		return 0, 0, false, errors.Join(fmt.Errorf("%w: physical index entry", ErrCorrupt), err)
	}
	start = int64(binary.BigEndian.Uint64(it.Key()[1:]))
	end = start + int64(binary.BigEndian.Uint32(v))
	return start, end, end > off, nil
}

// ReadLog calls fn with the published log entries from physical offset
// from on (the first one starting at or after it; records removed by
// DeleteTopic leave holes), in physical order, until fn returns false or
// the records delivered reach maxBytes (at least one is delivered). It
// returns where the next read continues: the end of the last entry fn
// accepted, or from when there was none. Entries alias the store's memory:
// fn must copy what it keeps.
func (s *Store) ReadLog(from int64, maxBytes int, fn func(e *LogEntry) bool) (next int64, err error) {
	if err := s.acquire(); err != nil {
		return from, err
	}
	defer s.release()
	end := s.physPublished.Load()
	next = from
	if from >= end {
		return next, nil
	}
	var lo, hi [9]byte
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: appendPhysKey(lo[:0], from), UpperBound: appendPhysKey(hi[:0], end)})
	if err != nil {
		return next, fmt.Errorf("store: read log: %w", err)
	}
	defer it.Close()
	var mk []byte
	var e LogEntry
	delivered := 0
	for ok := it.First(); ok && (delivered == 0 || delivered < maxBytes); ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return next, fmt.Errorf("store: read log: %w", err)
		}
		if len(k) != 9 || len(v) < physValueFixed {
			return next, fmt.Errorf("%w: physical index entry", ErrCorrupt)
		}
		phys := int64(binary.BigEndian.Uint64(k[1:]))
		size := int64(binary.BigEndian.Uint32(v))
		qid := int32(binary.BigEndian.Uint32(v[4:]))
		off := int64(binary.BigEndian.Uint64(v[8:]))
		topic := v[physValueFixed:]
		mk = appendQueuePrefix(mk[:0], prefixMessage, string(topic), qid)
		mk = binary.BigEndian.AppendUint64(mk, uint64(off))
		mv, closer, err := s.db.Get(mk)
		if errors.Is(err, pebble.ErrNotFound) {
			// DeleteTopic deletes physical index entries first; a crash
			// in the middle can leave messages without them, never the
			// other way round. An entry without its message is skipped.
			continue
		}
		if err != nil {
			return next, fmt.Errorf("store: read log: %w", err)
		}
		m, err := decodeValue(mv)
		if err != nil || recordPhys(m.rec) != phys || int64(len(m.rec)) != size {
			_ = closer.Close()
			if err == nil {
				err = fmt.Errorf("%w: record at physical offset %d does not match its index", ErrCorrupt, phys)
			}
			return next, err
		}
		e = LogEntry{Phys: phys, Topic: string(topic), QueueID: qid, QueueOffset: off, Record: m.rec,
			TagsCode: m.tagsCode, StoreTimestamp: m.storeTS, rawKeys: m.keys}
		if e.rawKeys == nil {
			e.rawKeys = []byte{}
		}
		keep := fn(&e)
		_ = closer.Close()
		if !keep {
			break
		}
		next = phys + size
		delivered += int(size)
	}
	return next, it.Error()
}

// AppendLog appends entries replicated from another store's log, keeping
// their physical offsets, queue offsets and store timestamps: a slave's
// store becomes a copy of its master's log. Entries must be in physical
// order, each starting at or after the log end (a gap is a hole the master
// left, records it deleted), its queue offset at or after its queue's next
// offset, and its record's QUEUEOFFSET and PHYSICALOFFSET fields equal to
// them; otherwise nothing is written and the error wraps ErrLogConflict.
// The entries are written in one atomic batch (fsynced in FlushSync mode),
// then published and notified as a commit round. ctx is checked once before
// the write.
func (s *Store) AppendLog(ctx context.Context, entries []LogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	size := 0
	for i := range entries {
		e := &entries[i]
		if err := checkName("topic", e.Topic, MaxNameLen); err != nil {
			return err
		}
		if err := checkQueue(e.QueueID); err != nil {
			return err
		}
		n := len(e.Record)
		if n < minRecordLen || n > MaxPutBytes || int(binary.BigEndian.Uint32(e.Record)) != n {
			return fmt.Errorf("%w: replicated record of %d bytes", ErrInvalid, n)
		}
		if recordPhys(e.Record) != e.Phys || int64(binary.BigEndian.Uint64(e.Record[posQueueOffset:])) != e.QueueOffset {
			return fmt.Errorf("%w: record at %d holds other offsets than its entry", ErrLogConflict, e.Phys)
		}
		for _, k := range e.Keys {
			if err := checkName("key", k, MaxNameLen); err != nil {
				return err
			}
		}
		size += n
	}
	if err := s.failedErr(); err != nil {
		return err
	}
	if err := s.disk.admit(size, len(entries)); err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.failedErr(); err != nil {
		return err
	}
	physNext, lastTS := s.physNext, s.lastTS
	touched := s.touched[:0]
	defer func() {
		for i, q := range touched {
			q.touched = false
			touched[i] = nil
		}
		s.touched = touched[:0]
	}()
	next := map[*queue]int64{}  // queue → next offset after the entries
	first := map[*queue]int64{} // queue → its first entry's offset
	for i := range entries {
		e := &entries[i]
		if e.Phys < physNext {
			return fmt.Errorf("%w: entry at %d below the log end %d", ErrLogConflict, e.Phys, physNext)
		}
		q := s.queueForAppendLocked(e.Topic, e.QueueID)
		qn, ok := next[q]
		if !ok {
			qn = q.next
			first[q] = e.QueueOffset
		}
		if e.QueueOffset < qn {
			return fmt.Errorf("%w: %s/%d offset %d below the queue's next offset %d", ErrLogConflict, e.Topic, e.QueueID, e.QueueOffset, qn)
		}
		next[q] = e.QueueOffset + 1
		if !q.touched {
			q.touched = true
			touched = append(touched, q)
		}
		physNext = e.Phys + int64(len(e.Record))
		lastTS = max(lastTS, e.StoreTimestamp)
	}
	b := s.db.NewBatch()
	defer b.Close()
	for i := range entries {
		e := &entries[i]
		hdr, keysLen := valueHeaderLen(e.Keys)
		op := b.SetDeferred(msgKeyLen(e.Topic), hdr+len(e.Record))
		putMsgKey(op.Key, e.Topic, e.QueueID, e.QueueOffset)
		p := putValueHeader(op.Value, e.TagsCode, e.StoreTimestamp, e.Keys, keysLen)
		copy(op.Value[p:], e.Record)
		if err := op.Finish(); err != nil {
			return fmt.Errorf("store: append log: %w", err)
		}
		op = b.SetDeferred(9, physValueFixed+len(e.Topic))
		op.Key[0] = prefixPhys
		binary.BigEndian.PutUint64(op.Key[1:], uint64(e.Phys))
		binary.BigEndian.PutUint32(op.Value[0:], uint32(len(e.Record)))
		binary.BigEndian.PutUint32(op.Value[4:], uint32(e.QueueID))
		binary.BigEndian.PutUint64(op.Value[8:], uint64(e.QueueOffset))
		copy(op.Value[physValueFixed:], e.Topic)
		if err := op.Finish(); err != nil {
			return fmt.Errorf("store: append log: %w", err)
		}
		for _, k := range e.Keys {
			if err := b.Set(appendKeyIndexKey(nil, e.Topic, k, e.StoreTimestamp, e.Phys), nil, nil); err != nil {
				return fmt.Errorf("store: append log: %w", err)
			}
		}
	}
	// A queue that starts past its next offset (the master removed its
	// first messages) needs no meta: Open takes the min offset from the
	// first message key.
	if err := s.commitBatch(b, s.opts.FlushMode == FlushSync, "append log"); err != nil {
		return err
	}
	if s.opts.FlushMode == FlushSync {
		s.syncs.Add(1)
	} else {
		s.dirty.Store(true)
	}
	s.rounds.Add(1)
	s.physNext, s.lastTS = physNext, lastTS
	s.physPublished.Store(physNext)
	for q, n := range next {
		if q.min.Load() == q.next {
			q.min.Store(first[q]) // an empty queue starts at its first entry
		}
		q.next = n
		q.max.Store(n)
		if s.opts.Notify != nil {
			s.opts.Notify(q.topic, q.id, n)
		}
	}
	return nil
}

// TruncateLog removes every record at physical offset from and above, with
// its index entries, and the epochs starting at or above from, durably
// (fsync), in one batch: a slave repairs a log that diverged from its
// master's this way. The queues' next offsets move back to their first
// removed offset, the log end to from (when it was beyond).
func (s *Store) TruncateLog(from int64) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.failedErr(); err != nil {
		return err
	}
	if from < 0 {
		return fmt.Errorf("%w: truncate at %d", ErrInvalid, from)
	}
	b := s.db.NewBatch()
	defer b.Close()
	firstRemoved := map[*queue]int64{}
	var lo [9]byte
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: appendPhysKey(lo[:0], from), UpperBound: []byte{prefixPhys + 1}})
	if err != nil {
		return fmt.Errorf("store: truncate log: %w", err)
	}
	var mk []byte
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != 9 || len(v) < physValueFixed {
			_ = it.Close()
			return fmt.Errorf("%w: physical index entry", ErrCorrupt)
		}
		qid := int32(binary.BigEndian.Uint32(v[4:]))
		off := int64(binary.BigEndian.Uint64(v[8:]))
		topic := string(v[physValueFixed:])
		mk = appendMsgKey(mk[:0], topic, qid, off)
		mv, closer, err := s.db.Get(mk)
		switch {
		case errors.Is(err, pebble.ErrNotFound):
		case err != nil:
			_ = it.Close()
			return fmt.Errorf("store: truncate log: %w", err)
		default:
			m, derr := decodeValue(mv)
			if derr == nil {
				derr = s.deleteIndexes(b, topic, m)
			}
			_ = closer.Close()
			if derr != nil {
				_ = it.Close()
				return fmt.Errorf("store: truncate log: %w", derr)
			}
			if err := b.Delete(mk, nil); err != nil {
				_ = it.Close()
				return fmt.Errorf("store: truncate log: %w", err)
			}
		}
		if err := b.Delete(k, nil); err != nil {
			_ = it.Close()
			return fmt.Errorf("store: truncate log: %w", err)
		}
		if q := s.lookupQueue(topic, qid); q != nil {
			if cur, ok := firstRemoved[q]; !ok || off < cur {
				firstRemoved[q] = off
			}
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: truncate log: %w", err)
	}
	epochs, err := s.epochsLocked()
	if err != nil {
		return err
	}
	for _, ep := range epochs {
		if ep.StartOffset >= from {
			if err := b.Delete(epochKey(ep.Epoch), nil); err != nil {
				return fmt.Errorf("store: truncate log: %w", err)
			}
		}
	}
	for q, off := range firstRemoved {
		var v [16]byte
		binary.BigEndian.PutUint64(v[0:], uint64(off))
		binary.BigEndian.PutUint64(v[8:], uint64(min(q.min.Load(), off)))
		if err := b.Set(q.metaKey, v[:], nil); err != nil {
			return fmt.Errorf("store: truncate log: %w", err)
		}
	}
	physNext := min(s.physNext, from)
	var g [16]byte
	binary.BigEndian.PutUint64(g[0:], uint64(physNext))
	binary.BigEndian.PutUint64(g[8:], uint64(s.lastTS))
	if err := b.Set(keyGlobal, g[:], nil); err != nil {
		return fmt.Errorf("store: truncate log: %w", err)
	}
	if err := s.commitBatch(b, true, "truncate log"); err != nil {
		return err
	}
	s.physNext = physNext
	s.physPublished.Store(physNext)
	for q, off := range firstRemoved {
		q.next = off
		q.max.Store(off)
		if q.min.Load() > off {
			q.min.Store(off)
		}
	}
	return nil
}

// Epoch is one epoch of the log: the records from StartOffset up to the
// next epoch's start were written by one run of a master.
type Epoch struct {
	Epoch       int32
	StartOffset int64
}

func epochKey(epoch int32) []byte {
	return binary.BigEndian.AppendUint32([]byte{prefixEpoch}, uint32(epoch))
}

// Epochs returns the log's epochs, ascending.
func (s *Store) Epochs() ([]Epoch, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	return s.epochsLocked()
}

func (s *Store) epochsLocked() ([]Epoch, error) {
	var out []Epoch
	err := s.scanPrefix([]byte{prefixEpoch}, func(k, v []byte) (bool, error) {
		if len(k) != 5 || len(v) != 8 {
			return false, fmt.Errorf("%w: epoch entry", ErrCorrupt)
		}
		out = append(out, Epoch{Epoch: int32(binary.BigEndian.Uint32(k[1:])), StartOffset: int64(binary.BigEndian.Uint64(v))})
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: epochs: %w", err)
	}
	slices.SortFunc(out, func(a, b Epoch) int { return int(int64(a.Epoch) - int64(b.Epoch)) })
	return out, nil
}

// AddEpoch records durably that epoch starts at start. It must be above
// every recorded epoch, and start at or above their starts.
func (s *Store) AddEpoch(epoch int32, start int64) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	epochs, err := s.epochsLocked()
	if err != nil {
		return err
	}
	if n := len(epochs); n > 0 && (epochs[n-1].Epoch >= epoch || epochs[n-1].StartOffset > start) {
		return fmt.Errorf("%w: epoch %d at %d after epoch %d at %d", ErrInvalid, epoch, start, epochs[n-1].Epoch, epochs[n-1].StartOffset)
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(start))
	return s.setOne(epochKey(epoch), v[:], true, "add epoch")
}

// StartEpoch begins a new epoch at the log end (a master starting): the
// next epoch number, or, when the last epoch holds no record (it starts at
// the log end), that epoch renumbered, so that restarts without writes do
// not pile up epochs. The first epoch starts at 0, whatever the log holds.
// It returns the epoch and its start.
func (s *Store) StartEpoch() (Epoch, error) {
	if err := s.acquire(); err != nil {
		return Epoch{}, err
	}
	defer s.release()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.failedErr(); err != nil {
		return Epoch{}, err
	}
	epochs, err := s.epochsLocked()
	if err != nil {
		return Epoch{}, err
	}
	// The first epoch covers the whole log so far (a store that held
	// records before it ran as a master included).
	ep := Epoch{Epoch: 1, StartOffset: 0}
	b := s.db.NewBatch()
	defer b.Close()
	if n := len(epochs); n > 0 {
		ep.StartOffset = s.physNext
		last := epochs[n-1]
		ep.Epoch = last.Epoch + 1
		if last.StartOffset == s.physNext {
			if err := b.Delete(epochKey(last.Epoch), nil); err != nil {
				return Epoch{}, err
			}
		}
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(ep.StartOffset))
	if err := b.Set(epochKey(ep.Epoch), v[:], nil); err != nil {
		return Epoch{}, err
	}
	if err := s.commitBatch(b, true, "start epoch"); err != nil {
		return Epoch{}, err
	}
	return ep, nil
}

var keyLogID = []byte{prefixLogID}

// LogID returns the id of the log ("" while none was set).
func (s *Store) LogID() (string, error) {
	if err := s.acquire(); err != nil {
		return "", err
	}
	defer s.release()
	v, ok, err := s.getCopy(keyLogID)
	if err != nil || !ok {
		return "", err
	}
	return string(v), nil
}

// SetLogID sets the id of the log durably (a slave takes its master's).
func (s *Store) SetLogID(id string) error {
	if id == "" || len(id) > MaxNameLen {
		return fmt.Errorf("%w: log id %q", ErrInvalid, id)
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	return s.setOne(keyLogID, []byte(id), true, "set log id")
}

// EnsureLogID returns the log's id, creating a random one when it has
// none (a master's log).
func (s *Store) EnsureLogID() (string, error) {
	id, err := s.LogID()
	if err != nil || id != "" {
		return id, err
	}
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", fmt.Errorf("store: log id: %w", err)
	}
	id = hex.EncodeToString(r[:])
	return id, s.SetLogID(id)
}
