package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// bounds holds iterator bound buffers, recycled through Store.bounds.
type bounds struct{ lo, hi []byte }

// MinOffset returns the smallest offset still stored in the queue (equal to
// MaxOffset when the queue is empty), 0 for an unknown queue. It reads only
// memory.
func (s *Store) MinOffset(topic string, queue int32) (int64, error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.release()
	if q := s.lookupQueue(topic, queue); q != nil {
		return min(q.min.Load(), q.max.Load()), nil
	}
	return 0, nil
}

// MaxOffset returns the next offset to be written to the queue (readable
// messages are below it), 0 for an unknown queue. It reads only memory.
func (s *Store) MaxOffset(topic string, queue int32) (int64, error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.release()
	if q := s.lookupQueue(topic, queue); q != nil {
		return q.max.Load(), nil
	}
	return 0, nil
}

// QueueIDs returns the sorted ids of the topic's queues that were ever
// written (and not deleted with DeleteTopic).
func (s *Store) QueueIDs(topic string) ([]int32, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	var ids []int32
	s.qmu.RLock()
	for k := range s.qmu.m {
		if k.topic == topic {
			ids = append(ids, k.id)
		}
	}
	s.qmu.RUnlock()
	slices.Sort(ids)
	return ids, nil
}

// Topics returns the sorted names of topics that have queues.
func (s *Store) Topics() ([]string, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	seen := make(map[string]struct{})
	s.qmu.RLock()
	for k := range s.qmu.m {
		seen[k.topic] = struct{}{}
	}
	s.qmu.RUnlock()
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	slices.Sort(out)
	return out, nil
}

// Get scans the queue from offset (or from the min offset if offset is
// below it) up to the published max offset, calling fn for each stored
// message with its record and tags code. fn returns whether it took the
// message (false = filtered out). Scanning stops after maxMsgs taken
// messages, before a record that would push the taken bytes over maxBytes
// (the first taken message is never refused for size; maxBytes <= 0 means no
// byte limit), or after MaxScanPerGet entries.
//
// next is the offset after the last scanned entry (filtered entries count as
// scanned), or the start offset when nothing was scanned. Get does not
// classify offsets: the caller compares offset with MinOffset/MaxOffset
// first (OFFSET_TOO_SMALL, OVERFLOW…).
//
// rec is valid only during the call to fn (copy it to keep it) and must not
// be modified. fn must not call Close. Get reads Pebble; it does not wait
// for other goroutines.
func (s *Store) Get(topic string, queue int32, offset int64, maxMsgs, maxBytes int,
	fn func(rec []byte, tagsCode int64) bool) (next int64, err error) {
	if maxMsgs <= 0 {
		return offset, fmt.Errorf("%w: maxMsgs %d", ErrInvalid, maxMsgs)
	}
	if offset < 0 {
		return offset, fmt.Errorf("%w: offset %d", ErrInvalid, offset)
	}
	if err := s.acquire(); err != nil {
		return offset, err
	}
	defer s.release()
	q := s.lookupQueue(topic, queue)
	if q == nil {
		return offset, nil
	}
	maxOff := q.max.Load()
	start := max(offset, q.min.Load())
	if start >= maxOff {
		return offset, nil
	}
	bd := s.bounds.Get().(*bounds)
	defer s.bounds.Put(bd)
	bd.lo = appendMsgKey(bd.lo[:0], topic, queue, start)
	bd.hi = appendMsgKey(bd.hi[:0], topic, queue, maxOff)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: bd.lo, UpperBound: bd.hi})
	if err != nil {
		return offset, fmt.Errorf("store: get: %w", err)
	}
	next = start
	taken, bytes, scanned := 0, 0, 0
	for ok := it.First(); ok; ok = it.Next() {
		off := msgKeyOffset(it.Key())
		v, err := it.ValueAndErr()
		if err != nil {
			return next, errors.Join(fmt.Errorf("store: get: %w", err), it.Close())
		}
		m, err := decodeValue(v)
		if err != nil {
			return next, errors.Join(fmt.Errorf("store: get %s/%d@%d: %w", topic, queue, off, err), it.Close())
		}
		if taken > 0 && maxBytes > 0 && bytes+len(m.rec) > maxBytes {
			break
		}
		next = off + 1
		scanned++
		if fn(m.rec, m.tagsCode) {
			taken++
			bytes += len(m.rec)
			if taken >= maxMsgs {
				break
			}
		}
		if scanned >= MaxScanPerGet {
			break
		}
	}
	if err := it.Close(); err != nil {
		return next, fmt.Errorf("store: get: %w", err)
	}
	return next, nil
}

// EarliestStoreTime returns the store timestamp (ms) of the queue's oldest
// stored message, or ErrNotFound when the queue is empty or unknown.
func (s *Store) EarliestStoreTime(topic string, queue int32) (int64, error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.release()
	q := s.lookupQueue(topic, queue)
	if q == nil {
		return 0, fmt.Errorf("%w: queue %s/%d", ErrNotFound, topic, queue)
	}
	var ts int64
	found := false
	err := s.scanQueue(q, q.min.Load(), q.max.Load(), func(_ int64, m msgValue) bool {
		ts, found = m.storeTS, true
		return false
	})
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%w: queue %s/%d is empty", ErrNotFound, topic, queue)
	}
	return ts, nil
}

// scanQueue iterates stored messages with offsets in [from, to) in order
// until fn returns false.
func (s *Store) scanQueue(q *queue, from, to int64, fn func(off int64, m msgValue) bool) error {
	if from >= to {
		return nil
	}
	lo := appendMsgKey(nil, q.topic, q.id, from)
	hi := appendMsgKey(nil, q.topic, q.id, to)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("store: scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return errors.Join(fmt.Errorf("store: scan: %w", err), it.Close())
		}
		m, err := decodeValue(v)
		if err != nil {
			return errors.Join(err, it.Close())
		}
		if !fn(msgKeyOffset(it.Key()), m) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: scan: %w", err)
	}
	return nil
}

// SearchOffset implements SEARCH_OFFSET_BY_TIMESTAMP (protocol doc §3.2)
// over store timestamps, which are non-decreasing in offset order, by binary
// search (O(log n) seeks).
//
// Lower boundary (upper == false): the first offset whose store time is >=
// ts; the max offset if every message is older (or the queue is empty).
//
// Upper boundary (upper == true): the last offset whose store time is <= ts;
// the min offset if every message is newer; the max offset if the queue is
// empty. (Java's BoundaryType.UPPER.)
//
// An unknown queue yields 0.
func (s *Store) SearchOffset(topic string, queue int32, ts int64, upper bool) (int64, error) {
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.release()
	q := s.lookupQueue(topic, queue)
	if q == nil {
		return 0, nil
	}
	maxOff := q.max.Load()
	minOff := min(q.min.Load(), maxOff)
	if minOff >= maxOff {
		return maxOff, nil
	}
	lo := appendMsgKey(nil, topic, queue, minOff)
	hi := appendMsgKey(nil, topic, queue, maxOff)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, fmt.Errorf("store: search: %w", err)
	}
	key := make([]byte, 0, len(lo))
	// Find the first offset whose time is >= ts (lower) or > ts (upper).
	var searchErr error
	pred := func(off int64) bool {
		if searchErr != nil {
			return true
		}
		key = appendMsgKey(key[:0], topic, queue, off)
		if !it.SeekGE(key) {
			// Removed concurrently by retention past this point; treat the
			// remainder as "after".
			searchErr = it.Error()
			return true
		}
		v, err := it.ValueAndErr()
		if err != nil {
			searchErr = err
			return true
		}
		m, err := decodeValue(v)
		if err != nil {
			searchErr = err
			return true
		}
		if upper {
			return m.storeTS > ts
		}
		return m.storeTS >= ts
	}
	loOff, hiOff := minOff, maxOff // invariant: pred false below loOff, true at hiOff
	for loOff < hiOff {
		mid := loOff + (hiOff-loOff)/2
		if pred(mid) {
			hiOff = mid
		} else {
			loOff = mid + 1
		}
	}
	if err := errors.Join(searchErr, it.Close()); err != nil {
		return 0, fmt.Errorf("store: search: %w", err)
	}
	if !upper {
		return loOff, nil
	}
	if loOff == minOff {
		return minOff, nil
	}
	return loOff - 1, nil
}

// GetByPhysicalOffset returns a copy of the record stored at the physical
// offset (VIEW_MESSAGE_BY_ID), or ErrNotFound if no published record starts
// there (never written, removed by retention or DeleteTopic).
func (s *Store) GetByPhysicalOffset(phys int64) ([]byte, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	return s.getByPhys(phys, "")
}

// getByPhys resolves phys through the physical index; if topic is not empty
// the record must belong to it.
func (s *Store) getByPhys(phys int64, topic string) ([]byte, error) {
	if phys < 0 || phys >= s.physPublished.Load() {
		return nil, fmt.Errorf("%w: physical offset %d", ErrNotFound, phys)
	}
	var kb [9]byte
	v, closer, err := s.db.Get(appendPhysKey(kb[:0], phys))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: physical offset %d", ErrNotFound, phys)
	}
	if err != nil {
		return nil, fmt.Errorf("store: physical index: %w", err)
	}
	if len(v) < physValueFixed {
		_ = closer.Close()
		return nil, fmt.Errorf("%w: physical index entry %d", ErrCorrupt, phys)
	}
	qid := int32(binary.BigEndian.Uint32(v[4:]))
	off := int64(binary.BigEndian.Uint64(v[8:]))
	t := string(v[physValueFixed:])
	_ = closer.Close()
	if topic != "" && t != topic {
		return nil, fmt.Errorf("%w: physical offset %d is in another topic", ErrNotFound, phys)
	}
	q := s.lookupQueue(t, qid)
	if q == nil || off >= q.max.Load() {
		return nil, fmt.Errorf("%w: physical offset %d", ErrNotFound, phys)
	}
	mk := appendMsgKey(make([]byte, 0, msgKeyLen(t)), t, qid, off)
	v, closer, err = s.db.Get(mk)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: physical offset %d (removed)", ErrNotFound, phys)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get message: %w", err)
	}
	defer closer.Close()
	m, err := decodeValue(v)
	if err != nil {
		return nil, err
	}
	if recordPhys(m.rec) != phys {
		// A stale index entry whose queue offset was reused after DeleteTopic.
		return nil, fmt.Errorf("%w: physical offset %d (stale index)", ErrNotFound, phys)
	}
	return slices.Clone(m.rec), nil
}

// QueryByKey returns copies of the records of topic indexed under key (a
// KEYS value or a UNIQ_KEY) whose store time is in [begin, end], newest
// first, at most maxNum (clamped to 1..MaxQueryNum). Index entries of
// removed messages are skipped. It returns an empty slice, not an error,
// when nothing matches.
func (s *Store) QueryByKey(topic, key string, maxNum int, begin, end int64) ([][]byte, error) {
	if err := checkName("topic", topic, MaxNameLen); err != nil {
		return nil, err
	}
	if err := checkName("key", key, MaxNameLen); err != nil {
		return nil, err
	}
	maxNum = max(1, min(maxNum, MaxQueryNum))
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	if begin > end {
		return nil, nil
	}
	prefix := appendKeyIndexPrefix(nil, topic, key)
	lo := binary.BigEndian.AppendUint64(slices.Clone(prefix), tsKey(begin))
	var hi []byte
	if tsKey(end) == ^uint64(0) {
		hi = prefixEnd(prefix)
	} else {
		hi = binary.BigEndian.AppendUint64(slices.Clone(prefix), tsKey(end)+1)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, fmt.Errorf("store: query by key: %w", err)
	}
	var out [][]byte
	for ok := it.Last(); ok && len(out) < maxNum; ok = it.Prev() {
		k := it.Key()
		if len(k) != len(prefix)+16 {
			return nil, errors.Join(errCorruptKey(k), it.Close())
		}
		phys := int64(binary.BigEndian.Uint64(k[len(k)-8:]))
		rec, err := s.getByPhys(phys, topic)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, errors.Join(err, it.Close())
		}
		out = append(out, rec)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("store: query by key: %w", err)
	}
	return out, nil
}

// ScanKey calls fn with a copy of each record of topic indexed under key
// (a KEYS value or a UNIQ_KEY) whose store time is at least begin, oldest
// first, until fn returns false. Unlike QueryByKey it has no result cap:
// a caller that must not miss a record (a transaction's outcome lookup)
// sees every one. Index entries of removed messages are skipped.
func (s *Store) ScanKey(topic, key string, begin int64, fn func(rec []byte) bool) error {
	if err := checkName("topic", topic, MaxNameLen); err != nil {
		return err
	}
	if err := checkName("key", key, MaxNameLen); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	prefix := appendKeyIndexPrefix(nil, topic, key)
	lo := binary.BigEndian.AppendUint64(slices.Clone(prefix), tsKey(begin))
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return fmt.Errorf("store: scan key: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+16 {
			return errors.Join(errCorruptKey(k), it.Close())
		}
		rec, err := s.getByPhys(int64(binary.BigEndian.Uint64(k[len(k)-8:])), topic)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return errors.Join(err, it.Close())
		}
		if !fn(rec) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: scan key: %w", err)
	}
	return nil
}
