package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// deleteChunk bounds the index deletions per batch in TruncateBefore and
// DeleteTopic.
const deleteChunk = 4096

// CommitOffset stores the consumer group's offset (next message to consume)
// for the queue. It is cheap: written to Pebble without fsync, so it becomes
// durable with the next fsync of any write (the next SYNC Put round, the
// ASYNC background sync, a config/meta write, or Close). A process crash
// normally loses nothing; a machine crash can lose the commits since the
// last fsync, which consumers tolerate (re-delivery).
func (s *Store) CommitOffset(group, topic string, queue int32, off int64) (err error) {
	if err := checkOffsetArgs(group, topic, queue); err != nil {
		return err
	}
	if off < 0 {
		return fmt.Errorf("%w: consumer offset %d", ErrInvalid, off)
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	if err := s.failedErr(); err != nil {
		return err
	}
	var kb [128]byte
	var vb [8]byte
	binary.BigEndian.PutUint64(vb[:], uint64(off))
	return s.setOne(appendOffsetKey(kb[:0], group, topic, queue), vb[:], false, "commit offset")
}

// setOne writes (or with a nil value deletes) one key through commitBatch.
func (s *Store) setOne(key, value []byte, sync bool, what string) error {
	b := s.db.NewBatch()
	defer b.Close()
	var err error
	if value == nil {
		err = b.Delete(key, nil)
	} else {
		err = b.Set(key, value, nil)
	}
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return s.commitBatch(b, sync, what)
}

func checkOffsetArgs(group, topic string, queue int32) error {
	if err := checkName("group", group, MaxNameLen); err != nil {
		return err
	}
	if err := checkName("topic", topic, MaxNameLen); err != nil {
		return err
	}
	return checkQueue(queue)
}

// QueryOffset returns the group's committed offset for the queue and whether
// one exists.
func (s *Store) QueryOffset(group, topic string, queue int32) (int64, bool, error) {
	if err := checkOffsetArgs(group, topic, queue); err != nil {
		return 0, false, err
	}
	if err := s.acquire(); err != nil {
		return 0, false, err
	}
	defer s.release()
	var kb [128]byte
	v, closer, err := s.db.Get(appendOffsetKey(kb[:0], group, topic, queue))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("store: query offset: %w", err)
	}
	defer closer.Close()
	off, err := decodeInt64(v)
	if err != nil {
		return 0, false, err
	}
	return off, true, nil
}

// ConsumerOffsets returns the group's committed offsets for every queue of
// the topic.
func (s *Store) ConsumerOffsets(group, topic string) (map[int32]int64, error) {
	out := make(map[int32]int64)
	err := s.ScanOffsets(topic, func(g string, q int32, off int64) bool {
		if g == group {
			out[q] = off
		}
		return true
	})
	return out, err
}

// ScanOffsets calls fn for every committed consumer offset of the topic
// (every topic if topic is empty), ordered by topic, group, queue, until fn
// returns false. fn must not call Close.
func (s *Store) ScanOffsets(topic string, fn func(group string, queue int32, off int64) bool) error {
	return s.scanOffsets(topic, func(_, group string, queue int32, off int64) bool {
		return fn(group, queue, off)
	})
}

func (s *Store) scanOffsets(topic string, fn func(topic, group string, queue int32, off int64) bool) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	prefix := []byte{prefixOffset}
	if topic != "" {
		prefix = appendTopicPrefix(nil, prefixOffset, topic)
	}
	return s.scanPrefix(prefix, func(k, v []byte) (bool, error) {
		t, rest, ok := cutString16(k[1:])
		if !ok {
			return false, errCorruptKey(k)
		}
		g, rest, ok := cutString16(rest)
		if !ok || len(rest) != 4 {
			return false, errCorruptKey(k)
		}
		off, err := decodeInt64(v)
		if err != nil {
			return false, err
		}
		return fn(t, g, int32(binary.BigEndian.Uint32(rest)), off), nil
	})
}

func cutString16(b []byte) (string, []byte, bool) {
	if len(b) < 2 {
		return "", nil, false
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return "", nil, false
	}
	return string(b[2 : 2+n]), b[2+n:], true
}

// scanPrefix iterates keys with the prefix. Requires an acquired call.
func (s *Store) scanPrefix(prefix []byte, fn func(k, v []byte) (bool, error)) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return fmt.Errorf("store: scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return errors.Join(fmt.Errorf("store: scan: %w", err), it.Close())
		}
		cont, err := fn(it.Key(), v)
		if err != nil {
			return errors.Join(err, it.Close())
		}
		if !cont {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: scan: %w", err)
	}
	return nil
}

// PutTopicConfig durably (fsync) stores the broker's opaque topic config.
func (s *Store) PutTopicConfig(name string, v []byte) error {
	return s.putNamed(prefixTopicCfg, "topic", name, v)
}

// TopicConfig returns a copy of the topic's config and whether it exists.
func (s *Store) TopicConfig(name string) ([]byte, bool, error) {
	return s.getNamed(prefixTopicCfg, name)
}

// TopicConfigs returns copies of all topic configs by name.
func (s *Store) TopicConfigs() (map[string][]byte, error) { return s.allNamed(prefixTopicCfg) }

// PutGroupConfig durably stores the broker's opaque subscription group
// config.
func (s *Store) PutGroupConfig(name string, v []byte) error {
	return s.putNamed(prefixGroupCfg, "group", name, v)
}

// GroupConfig returns a copy of the group's config and whether it exists.
func (s *Store) GroupConfig(name string) ([]byte, bool, error) {
	return s.getNamed(prefixGroupCfg, name)
}

// GroupConfigs returns copies of all subscription group configs by name.
func (s *Store) GroupConfigs() (map[string][]byte, error) { return s.allNamed(prefixGroupCfg) }

// DeleteGroup durably removes the group's config and all its consumer
// offsets (scanning the offset key space).
func (s *Store) DeleteGroup(name string) (err error) {
	if err := checkName("group", name, MaxNameLen); err != nil {
		return err
	}
	var keys [][]byte
	err = s.scanOffsets("", func(topic, group string, queue int32, _ int64) bool {
		if group == name {
			keys = append(keys, appendOffsetKey(nil, group, topic, queue))
		}
		return true
	})
	if err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	if err := s.failedErr(); err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, k := range keys {
		if err := b.Delete(k, nil); err != nil {
			return fmt.Errorf("store: delete group: %w", err)
		}
	}
	if err := b.Delete(appendNameKey(nil, prefixGroupCfg, name), nil); err != nil {
		return fmt.Errorf("store: delete group: %w", err)
	}
	return s.commitBatch(b, true, "delete group")
}

func (s *Store) putNamed(prefix byte, kind, name string, v []byte) (err error) {
	if err := checkName(kind, name, MaxNameLen); err != nil {
		return err
	}
	if len(v) > MaxValueLen {
		return fmt.Errorf("%w: %s config of %d bytes", ErrInvalid, kind, len(v))
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	if err := s.failedErr(); err != nil {
		return err
	}
	if v == nil {
		v = []byte{}
	}
	return s.setOne(appendNameKey(nil, prefix, name), v, true, "put "+kind+" config")
}

func (s *Store) getNamed(prefix byte, name string) ([]byte, bool, error) {
	if err := s.acquire(); err != nil {
		return nil, false, err
	}
	defer s.release()
	return s.getCopy(appendNameKey(nil, prefix, name))
}

func (s *Store) getCopy(key []byte) ([]byte, bool, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: get: %w", err)
	}
	out := slices.Clone(v)
	if out == nil {
		out = []byte{}
	}
	_ = closer.Close()
	return out, true, nil
}

func (s *Store) allNamed(prefix byte) (map[string][]byte, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.release()
	out := make(map[string][]byte)
	err := s.scanPrefix([]byte{prefix}, func(k, v []byte) (bool, error) {
		out[string(k[1:])] = append([]byte{}, v...)
		return true, nil
	})
	return out, err
}

// PutMeta durably (fsync) stores a value in the broker's meta key space
// (transaction op records, delay-level schedule progress…). Keys are
// 1..MaxMetaKeyLen bytes; values at most MaxValueLen.
func (s *Store) PutMeta(key, value []byte) (err error) {
	if err := checkMetaKey(key); err != nil {
		return err
	}
	if len(value) > MaxValueLen {
		return fmt.Errorf("%w: meta value of %d bytes", ErrInvalid, len(value))
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	if err := s.failedErr(); err != nil {
		return err
	}
	if value == nil {
		value = []byte{}
	}
	return s.setOne(metaKey(key), value, true, "put meta")
}

// GetMeta returns a copy of the meta value and whether it exists.
func (s *Store) GetMeta(key []byte) ([]byte, bool, error) {
	if err := checkMetaKey(key); err != nil {
		return nil, false, err
	}
	if err := s.acquire(); err != nil {
		return nil, false, err
	}
	defer s.release()
	return s.getCopy(metaKey(key))
}

// DeleteMeta durably removes a meta key (no error if absent).
func (s *Store) DeleteMeta(key []byte) (err error) {
	if err := checkMetaKey(key); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	if err := s.failedErr(); err != nil {
		return err
	}
	return s.setOne(metaKey(key), nil, true, "delete meta")
}

// ScanMeta calls fn, in key order, for every meta key starting with prefix
// (all keys if prefix is empty) until fn returns false. key and value are
// valid only during the call. fn must not call Close.
func (s *Store) ScanMeta(prefix []byte, fn func(key, value []byte) bool) error {
	if len(prefix) > MaxMetaKeyLen {
		return fmt.Errorf("%w: meta prefix of %d bytes", ErrInvalid, len(prefix))
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	return s.scanPrefix(metaKey(prefix), func(k, v []byte) (bool, error) {
		return fn(k[1:], v), nil
	})
}

func metaKey(k []byte) []byte { return append([]byte{prefixMeta}, k...) }

func checkMetaKey(k []byte) error {
	if len(k) == 0 || len(k) > MaxMetaKeyLen {
		return fmt.Errorf("%w: meta key of %d bytes", ErrInvalid, len(k))
	}
	return nil
}

// TruncateBefore removes the queue's messages below offset (retention) with
// their physical and key index entries, moving the min offset to
// min(offset, max offset). It is durable (fsync) when it returns. It holds
// the append lock while it runs (Puts wait), deleting in chunks of
// deleteChunk messages, each chunk atomic; after a crash the min offset is
// at a chunk boundary. Offsets at or below the current min are a no-op.
func (s *Store) TruncateBefore(topic string, queue int32, offset int64) error {
	if err := checkName("topic", topic, MaxNameLen); err != nil {
		return err
	}
	if err := checkQueue(queue); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.failedErr(); err != nil {
		return err
	}
	q := s.lookupQueue(topic, queue)
	if q == nil {
		return nil
	}
	offset = min(offset, q.next)
	for {
		from := q.min.Load()
		if from >= offset {
			return nil
		}
		to := min(offset, from+deleteChunk)
		b := s.db.NewBatch()
		var derr error
		err := s.scanQueue(q, from, to, func(_ int64, m msgValue) bool {
			derr = s.deleteIndexes(b, topic, m)
			return derr == nil
		})
		err = errors.Join(err, derr)
		if err == nil {
			err = b.DeleteRange(appendMsgKey(nil, topic, queue, from), appendMsgKey(nil, topic, queue, to), nil)
		}
		if err == nil {
			var v [16]byte
			binary.BigEndian.PutUint64(v[0:], uint64(q.next))
			binary.BigEndian.PutUint64(v[8:], uint64(to))
			err = b.Set(q.metaKey, v[:], nil)
		}
		if err == nil {
			err = s.setGlobalLocked(b)
		}
		if err == nil {
			err = s.commitBatch(b, true, "truncate")
		}
		if cerr := b.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("store: truncate %s/%d: %w", topic, queue, err)
		}
		q.min.Store(to)
	}
}

// setGlobalLocked adds the global meta (physical counter, last store
// timestamp) to b, which deletes physical index entries: Open recovers both
// from the last physical index entry, which b may delete, so they are kept
// here. Requires writeMu.
func (s *Store) setGlobalLocked(b *pebble.Batch) error {
	var v [16]byte
	binary.BigEndian.PutUint64(v[0:], uint64(s.physNext))
	binary.BigEndian.PutUint64(v[8:], uint64(s.lastTS))
	return b.Set(keyGlobal, v[:], nil)
}

// deleteIndexes adds deletions of a message's physical and key index
// entries to b.
func (s *Store) deleteIndexes(b *pebble.Batch, topic string, m msgValue) error {
	phys := recordPhys(m.rec)
	var kb [9]byte
	if err := b.Delete(appendPhysKey(kb[:0], phys), nil); err != nil {
		return err
	}
	var buf []byte
	var derr error
	err := forEachKey(m.keys, func(k []byte) {
		buf = appendKeyIndexKey(buf[:0], topic, string(k), m.storeTS, phys)
		if err := b.Delete(buf, nil); err != nil && derr == nil {
			derr = err
		}
	})
	return errors.Join(err, derr)
}

// DeleteTopic removes the topic's messages, queues (offsets restart at 0 if
// the topic is written again), index entries, consumer offsets and topic
// config, durably. It holds the append lock while it runs. It first deletes
// the physical index entries in chunks (reading every message of the topic),
// then everything else in one atomic batch; a crash in between leaves the
// topic readable with some physical index entries missing, and calling
// DeleteTopic again finishes the job.
func (s *Store) DeleteTopic(topic string) error { return s.DeleteTopicLogged(topic, nil) }

// DeleteTopicLogged is DeleteTopic that also appends marker (when not nil)
// to the log right after the deletion, under the same hold of the append
// lock: every record of the topic stored before the marker is deleted, and
// none stored after it (the records of a topic created again), which is
// how a slave replays a master's deletion at the right place in the log. A
// crash between the deletion and the marker's commit loses the marker.
func (s *Store) DeleteTopicLogged(topic string, marker *PutMessage) error {
	if err := checkName("topic", topic, MaxNameLen); err != nil {
		return err
	}
	var mr *putRequest
	if marker != nil {
		var err error
		if mr, err = s.newPutRequest([]PutMessage{*marker}); err != nil {
			return err
		}
		mr.res = make([]PutResult, 1)
		defer s.freePutRequest(mr)
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.failedErr(); err != nil {
		return err
	}
	msgPrefix := appendTopicPrefix(nil, prefixMessage, topic)
	b := s.db.NewBatch()
	n := 0
	err := s.scanPrefix(msgPrefix, func(_, v []byte) (bool, error) {
		m, err := decodeValue(v)
		if err != nil {
			return false, err
		}
		var kb [9]byte
		if err := b.Delete(appendPhysKey(kb[:0], recordPhys(m.rec)), nil); err != nil {
			return false, err
		}
		if n++; n%deleteChunk == 0 {
			if err := s.setGlobalLocked(b); err != nil {
				return false, err
			}
			if err := s.commitBatch(b, false, "delete topic"); err != nil {
				return false, err
			}
			_ = b.Close()
			b = s.db.NewBatch()
		}
		return true, nil
	})
	for _, p := range []byte{prefixMessage, prefixQueue, prefixKeyIndex, prefixOffset} {
		if err != nil {
			break
		}
		start := appendTopicPrefix(nil, p, topic)
		err = b.DeleteRange(start, prefixEnd(start), nil)
	}
	if err == nil {
		err = b.Delete(appendNameKey(nil, prefixTopicCfg, topic), nil)
	}
	if err == nil {
		err = s.setGlobalLocked(b)
	}
	if err == nil {
		err = s.commitBatch(b, true, "delete topic")
	}
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store: delete topic %s: %w", topic, err)
	}
	s.qmu.Lock()
	for k := range s.qmu.m {
		if k.topic == topic {
			delete(s.qmu.m, k)
		}
	}
	s.qmu.Unlock()
	if mr != nil {
		s.rounds.Add(1)
		s.inline[0] = mr
		err := s.commitLocked(s.inline[:])
		s.inline[0] = nil
		if err != nil {
			return fmt.Errorf("store: delete topic %s: marker: %w", topic, err)
		}
	}
	return nil
}

// AllOffsets calls fn for every committed consumer offset, ordered by
// topic, group, queue, until fn returns false.
func (s *Store) AllOffsets(fn func(topic, group string, queue int32, off int64) bool) error {
	return s.scanOffsets("", fn)
}

// DeleteTopicConfig removes the topic's config alone (a slave copying its
// master's topic table; the messages go with the master's delete record).
func (s *Store) DeleteTopicConfig(name string) error {
	return s.deleteNamed(prefixTopicCfg, "topic", name)
}

// DeleteGroupConfig removes the subscription group's config alone,
// keeping its consumer offsets (a slave copying its master's groups).
func (s *Store) DeleteGroupConfig(name string) error {
	return s.deleteNamed(prefixGroupCfg, "group", name)
}

func (s *Store) deleteNamed(prefix byte, kind, name string) error {
	if err := checkName(kind, name, MaxNameLen); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.release()
	if err := s.failedErr(); err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.Delete(appendNameKey(nil, prefix, name), nil); err != nil {
		return fmt.Errorf("store: delete %s config: %w", kind, err)
	}
	return s.commitBatch(b, true, "delete "+kind+" config")
}
