package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
)

// PutMessage is one message to append.
type PutMessage struct {
	// Topic and QueueID select the queue; QueueID must be >= 0.
	Topic   string
	QueueID int32
	// Record is the complete encoded stored record (§4.1) whose TOTALSIZE
	// (int32 at 0) equals len(Record). Put patches QUEUEOFFSET (20),
	// PHYSICALOFFSET (28) and STORETIMESTAMP (StoreTimestampPos) in place:
	// the caller must not touch Record until Put returns.
	Record []byte
	// StoreTimestampPos is the byte position of STORETIMESTAMP (56 for an
	// IPv4 born host, 68 for IPv6).
	StoreTimestampPos int
	// TagsCode is the consume-queue tags code (§4.8), handed back by Get.
	TagsCode int64
	// Keys are the index keys (the KEYS values and the UNIQ_KEY) for
	// QueryByKey; each non-empty and at most MaxNameLen bytes.
	Keys []string
}

// PutResult reports where a message was stored.
type PutResult struct {
	QueueOffset    int64
	PhysicalOffset int64
	StoreTimestamp int64 // ms since the Unix epoch
}

// putRequest is one Put or PutAsync call handed to the committer.
type putRequest struct {
	msgs []PutMessage
	res  []PutResult
	size int
	done chan error      // Put: capacity 1
	cb   func(err error) // PutAsync: called by the committer instead
}

// putQueueLen is the capacity of the committer's request queue: PutAsync
// callers queue without waiting while the committer is busy with a round
// (an fsync in SYNC mode), and wait once this many calls are queued.
const putQueueLen = 1024

// Put appends msgs in order, atomically (all or none, one Pebble batch).
// Several messages may target the same queue; they get consecutive offsets.
//
// In FlushSync mode Put returns after the WAL holding the messages was
// fsynced; concurrent Puts share one fsync. In FlushAsync mode it returns
// once the messages are applied and readable. ctx bounds only the wait for
// the committer to accept the call: once accepted, Put waits for the
// outcome (one commit round) because the committer patches the records.
// Put never returns a partial result.
func (s *Store) Put(ctx context.Context, msgs []PutMessage) ([]PutResult, error) {
	r, err := s.newPutRequest(msgs)
	if err != nil {
		return nil, err
	}
	r.res = make([]PutResult, len(msgs))
	if err := s.submit(ctx, r); err != nil {
		return nil, err
	}
	err = <-r.done
	res := r.res
	s.freePutRequest(r)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// PutAsync is Put without the wait: it queues msgs for the committer and
// returns. Once the round holding them is committed (fsynced in FlushSync
// mode, applied in FlushAsync mode) or failed, the committer fills res
// (len(msgs) entries) and calls done exactly once with the round's error,
// on the committer goroutine: done must return quickly, must not block and
// must not call Put, PutAsync, TruncateBefore or DeleteTopic. msgs, their
// records and res belong to the store until done is called (the committer
// patches the records).
//
// A non-nil error means the call was refused (invalid messages, failed or
// closed store, ctx ended while the queue was full) and done is never
// called. ctx bounds only the wait for room in the queue.
func (s *Store) PutAsync(ctx context.Context, msgs []PutMessage, res []PutResult, done func(err error)) error {
	r, err := s.newAsyncRequest(msgs, res, done)
	if err != nil {
		return err
	}
	return s.submit(ctx, r)
}

// newAsyncRequest checks and returns the pooled request of a PutAsync or
// PutAsyncInline call.
func (s *Store) newAsyncRequest(msgs []PutMessage, res []PutResult, done func(err error)) (*putRequest, error) {
	if len(res) != len(msgs) || done == nil {
		return nil, fmt.Errorf("%w: PutAsync needs one result slot per message and a callback", ErrInvalid)
	}
	r, err := s.newPutRequest(msgs)
	if err != nil {
		return nil, err
	}
	r.res, r.cb = res, done
	return r, nil
}

// PutAsyncInline is PutAsync that may commit on the caller's goroutine: in
// FlushAsync mode, while no Put or PutAsync call is queued or in a round
// (and the append lock is free), it commits msgs as a round of their own
// and calls done before returning, sparing the hand-off to the committer
// goroutine and its wake-up. Otherwise it queues msgs as PutAsync does.
// done then runs on the caller's goroutine, with no store lock held.
//
// Calls reach the store in the order they were made: a call that finds
// earlier calls queued or committing queues behind them, so that the calls
// one goroutine makes one after the other get ascending offsets in each
// queue, as with PutAsync. Under load (calls queued) the committer's group
// commit takes every call.
func (s *Store) PutAsyncInline(ctx context.Context, msgs []PutMessage, res []PutResult, done func(err error)) error {
	r, err := s.newAsyncRequest(msgs, res, done)
	if err != nil {
		return err
	}
	if s.opts.FlushMode != FlushAsync || !s.writeMu.TryLock() {
		return s.submit(ctx, r)
	}
	// Checked under writeMu: a call queued or in a round goes first.
	if s.queued.Load() != 0 {
		s.writeMu.Unlock()
		return s.submit(ctx, r)
	}
	if err := ctx.Err(); err != nil {
		s.writeMu.Unlock()
		s.freePutRequest(r)
		return err
	}
	if err := s.acquire(); err != nil {
		s.writeMu.Unlock()
		s.freePutRequest(r)
		return err
	}
	s.rounds.Add(1)
	s.inline[0] = r
	err = s.commitLocked(s.inline[:])
	s.inline[0] = nil
	s.writeMu.Unlock()
	s.finish(r, err)
	s.release()
	return nil
}

// newPutRequest validates msgs and returns a pooled request for them.
func (s *Store) newPutRequest(msgs []PutMessage) (*putRequest, error) {
	size, err := s.validatePut(msgs)
	if err != nil {
		return nil, err
	}
	if err := s.failedErr(); err != nil {
		return nil, err
	}
	if err := s.disk.admit(size, len(msgs)); err != nil {
		return nil, err
	}
	r := s.reqPool.Get().(*putRequest)
	r.msgs, r.size = msgs, size
	return r, nil
}

func (s *Store) freePutRequest(r *putRequest) {
	r.msgs, r.res, r.cb = nil, nil, nil
	s.reqPool.Put(r)
}

// submit queues r for the committer. The call counts as active while it
// queues, so Close (which waits for active calls before stopping the
// committer) never strands a queued request; on error r is freed.
func (s *Store) submit(ctx context.Context, r *putRequest) error {
	if err := ctx.Err(); err != nil {
		s.freePutRequest(r)
		return err
	}
	if err := s.acquire(); err != nil {
		s.freePutRequest(r)
		return err
	}
	defer s.release()
	// Counted before it is queued: PutAsyncInline must see it from now on.
	s.queued.Add(1)
	select {
	case s.reqs <- r:
		return nil
	default:
	}
	select {
	case s.reqs <- r:
		return nil
	case <-ctx.Done():
		s.queued.Add(-1)
		s.freePutRequest(r)
		return ctx.Err()
	}
}

// finish delivers a round's outcome to one request.
func (s *Store) finish(r *putRequest, err error) {
	if r.cb == nil {
		r.done <- err // Put frees r
		return
	}
	cb := r.cb
	s.freePutRequest(r)
	cb(err)
}

func (s *Store) validatePut(msgs []PutMessage) (int, error) {
	if len(msgs) == 0 {
		return 0, fmt.Errorf("%w: no messages", ErrInvalid)
	}
	total := 0
	for i := range msgs {
		m := &msgs[i]
		if err := checkName("topic", m.Topic, MaxNameLen); err != nil {
			return 0, err
		}
		if err := checkQueue(m.QueueID); err != nil {
			return 0, err
		}
		n := len(m.Record)
		if n < minRecordLen || n > s.opts.MaxRecordBytes {
			return 0, fmt.Errorf("%w: record of %d bytes (allowed %d..%d)", ErrInvalid, n, minRecordLen, s.opts.MaxRecordBytes)
		}
		if ts := int64(int32(binary.BigEndian.Uint32(m.Record[posTotalSize:]))); ts != int64(n) {
			return 0, fmt.Errorf("%w: record TOTALSIZE %d != length %d", ErrInvalid, ts, n)
		}
		if m.StoreTimestampPos < minStoreTimestampPos || m.StoreTimestampPos > n-8 {
			return 0, fmt.Errorf("%w: store timestamp position %d in a %d-byte record", ErrInvalid, m.StoreTimestampPos, n)
		}
		if len(m.Keys) > MaxKeysPerMessage {
			return 0, fmt.Errorf("%w: %d keys exceed %d", ErrInvalid, len(m.Keys), MaxKeysPerMessage)
		}
		for _, k := range m.Keys {
			if err := checkName("key", k, MaxNameLen); err != nil {
				return 0, err
			}
		}
		total += n
		if total > MaxPutBytes {
			return 0, fmt.Errorf("%w: Put of more than %d bytes", ErrInvalid, MaxPutBytes)
		}
	}
	return total, nil
}

// runCommitter is the single writer: it collects Put calls, commits them in
// one batch per round and releases their callers.
func (s *Store) runCommitter() {
	defer s.wg.Done()
	var pending []*putRequest
	for {
		select {
		case r := <-s.reqs:
			pending = append(pending[:0], r)
		case <-s.quit:
			// Close waited for every submit, so the queue holds all
			// that is left.
			for {
				select {
				case r := <-s.reqs:
					s.queued.Add(-1)
					s.finish(r, ErrClosed)
				default:
					return
				}
			}
		}
		size := pending[0].size
		yielded := false
	gather:
		for size < s.opts.MaxBatchBytes {
			select {
			case r := <-s.reqs:
				pending = append(pending, r)
				size += r.size
			default:
				if yielded {
					break gather
				}
				// Let the goroutines that are runnable now (callers on
				// their way to Put, typically woken by the previous
				// round) reach the channel before this round closes.
				// Without it a fast committer runs one Put per round
				// under load, paying a Pebble commit per message;
				// idle, it costs one scheduler pass.
				yielded = true
				runtime.Gosched()
			}
		}
		s.rounds.Add(1)
		err := s.commit(pending)
		// The round's offsets are assigned (or it failed): calls made from
		// now on may commit inline without overtaking it.
		s.queued.Add(-int64(len(pending)))
		for i, r := range pending {
			s.finish(r, err)
			pending[i] = nil
		}
	}
}

// commit writes one round. Offsets are assigned under writeMu, the batch is
// committed (fsynced in SYNC mode), then the new max offsets are published.
func (s *Store) commit(reqs []*putRequest) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.commitLocked(reqs)
}

// commitLocked is commit with writeMu held.
func (s *Store) commitLocked(reqs []*putRequest) error {
	if err := s.failedErr(); err != nil {
		return err
	}
	now := s.opts.Clock().UnixMilli()
	if now < s.lastTS {
		now = s.lastTS
	}
	b := s.db.NewBatch()
	defer b.Close()
	touched := s.touched[:0]
	refs := s.refs[:0]
	physNext := s.physNext
	maxKeys := 0 // most index keys of one message in the round
	// Pass 1: assign offsets, patch the records, report results.
	for _, r := range reqs {
		for i := range r.msgs {
			m := &r.msgs[i]
			q := s.queueForAppendLocked(m.Topic, m.QueueID)
			if !q.touched {
				q.touched = true
				q.round = int32(len(touched))
				q.count = 0
				touched = append(touched, q)
			}
			q.count++
			off := q.next
			q.next++
			phys := physNext
			rec := m.Record
			physNext += int64(len(rec))
			binary.BigEndian.PutUint64(rec[posQueueOffset:], uint64(off))
			binary.BigEndian.PutUint64(rec[posPhysOffset:], uint64(phys))
			binary.BigEndian.PutUint64(rec[m.StoreTimestampPos:], uint64(now))
			r.res[i] = PutResult{QueueOffset: off, PhysicalOffset: phys, StoreTimestamp: now}
			refs = append(refs, msgRef{m: m, q: q, off: off, phys: phys})
			maxKeys = max(maxKeys, len(m.Keys))
		}
	}
	// The batch is laid out key range by key range (each queue's messages,
	// then the physical index, then the key index) rather than message by
	// message: the memtable inserts a batch in order with a splice hint, so
	// neighbouring keys land next to each other at nearly no search cost,
	// where interleaved ranges made every insert a full skiplist descent.
	sorted := refs
	if len(touched) > 1 {
		// Counting sort by queue (stable: offsets stay ascending).
		start := int32(0)
		for _, q := range touched {
			q.round, start = start, start+q.count
		}
		sorted = slices.Grow(s.sorted[:0], len(refs))[:len(refs)]
		for _, ref := range refs {
			sorted[ref.q.round] = ref
			ref.q.round++
		}
		s.sorted = sorted
	}
	for _, ref := range sorted {
		m := ref.m
		hdr, keysLen := valueHeaderLen(m.Keys)
		op := b.SetDeferred(msgKeyLen(m.Topic), hdr+len(m.Record))
		putMsgKey(op.Key, m.Topic, m.QueueID, ref.off)
		p := putValueHeader(op.Value, m.TagsCode, now, m.Keys, keysLen)
		copy(op.Value[p:], m.Record)
		if err := op.Finish(); err != nil {
			return s.abortRound(touched, refs, err)
		}
	}
	for _, ref := range refs {
		m := ref.m
		op := b.SetDeferred(9, physValueFixed+len(m.Topic))
		op.Key[0] = prefixPhys
		binary.BigEndian.PutUint64(op.Key[1:], uint64(ref.phys))
		binary.BigEndian.PutUint32(op.Value[0:], uint32(len(m.Record)))
		binary.BigEndian.PutUint32(op.Value[4:], uint32(m.QueueID))
		binary.BigEndian.PutUint64(op.Value[8:], uint64(ref.off))
		copy(op.Value[physValueFixed:], m.Topic)
		if err := op.Finish(); err != nil {
			return s.abortRound(touched, refs, err)
		}
	}
	// Key index entries column by column (every message's first key, then
	// every message's second key, …): a column usually holds one kind of
	// key (the KEYS value, the UNIQ_KEY, a transaction's commit key), and
	// the UNIQ_KEYs and commit keys of consecutive messages are neighbours,
	// so the splice hint serves them where message-by-message order made
	// each key a jump to another range and a full skiplist descent.
	for col := 0; col < maxKeys; col++ {
		for _, ref := range refs {
			m := ref.m
			if col >= len(m.Keys) {
				continue
			}
			k := m.Keys[col]
			op := b.SetDeferred(keyIndexKeyLen(m.Topic, k), 0)
			appendKeyIndexKey(op.Key[:0], m.Topic, k, now, ref.phys)
			if err := op.Finish(); err != nil {
				return s.abortRound(touched, refs, err)
			}
		}
	}
	// No queue meta or global meta is written: the round's own message and
	// physical index keys carry the new next offsets, physical counter and
	// last store timestamp, which Open recovers from them (recover). The
	// metas are written only where keys that carry them are deleted
	// (TruncateBefore, DeleteTopic). Two keys fewer per round: a third
	// less memtable work for a round of one message.
	if err := s.commitBatch(b, s.opts.FlushMode == FlushSync, "commit"); err != nil {
		return s.abortRound(touched, refs, err)
	}
	if s.opts.FlushMode == FlushSync {
		s.syncs.Add(1)
	} else {
		s.dirty.Store(true)
	}
	s.physNext = physNext
	s.lastTS = now
	s.physPublished.Store(physNext)
	for i, q := range touched {
		q.touched = false
		q.max.Store(q.next)
		if s.opts.Notify != nil {
			s.opts.Notify(q.topic, q.id, q.next)
		}
		touched[i] = nil
	}
	s.touched = touched[:0]
	s.clearRefs(refs)
	return nil
}

// msgRef is one message of a commit round with its assigned position.
type msgRef struct {
	m    *PutMessage
	q    *queue
	off  int64
	phys int64
}

// clearRefs drops the round's references so that the scratch slices do not
// pin the callers' records. Requires writeMu.
func (s *Store) clearRefs(refs []msgRef) {
	clear(refs)
	s.refs = refs[:0]
	clear(s.sorted)
	s.sorted = s.sorted[:0]
}

// abortRound is abort for a round whose references are in refs.
func (s *Store) abortRound(touched []*queue, refs []msgRef, err error) error {
	s.clearRefs(refs)
	return s.abort(touched, err)
}

// abort undoes the in-memory offset assignment of a failed round.
func (s *Store) abort(touched []*queue, err error) error {
	for i, q := range touched {
		q.touched = false
		q.next = q.max.Load()
		touched[i] = nil
	}
	s.touched = touched[:0]
	return err
}

// queueForAppendLocked returns the queue, creating it. Requires writeMu.
func (s *Store) queueForAppendLocked(topic string, id int32) *queue {
	if q := s.lookupQueue(topic, id); q != nil {
		return q
	}
	q := newQueue(strings.Clone(topic), id) // topic may alias a caller's buffer (AppendLog)
	s.qmu.Lock()
	s.qmu.m[queueKey{q.topic, id}] = q // never the caller's string: the map keeps it
	s.qmu.Unlock()
	return q
}
