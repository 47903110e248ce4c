package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/client"
)

// slot is one record of an epoch: its message (kept to send it again if
// the broker discarded its half message), lane and, once sent, handle.
type slot struct {
	m    *client.Message
	ep   *epochTxn
	lane uint32
	i    uint32 // the slot's index in its epoch (propSlot)
	h    client.TxHandle
	// try is the attempt whose half message the broker acknowledged (0:
	// the first); scale-out tags each attempt (propTry) so that any worker
	// tells an orphan of an uncertain attempt from the accepted copy.
	try uint32
}

// HalfSent implements client.HalfCallback: the slot itself receives the
// outcome of its half send (no closure per record).
func (sl *slot) HalfSent(h client.TxHandle, err error) { sl.ep.onHalf(sl, h, err) }

const chunkSize = 1024

// epochTxn is the open (or sealed, not yet committed) transaction of one
// epoch. Slots live in fixed chunks so that send goroutines can fill
// theirs while Write appends.
type epochTxn struct {
	epoch  uint64
	tag    string    // epoch in decimal (PropEpoch)
	first  time.Time // first Write
	n      int
	chunks []*[chunkSize]slot
	desc   []byte   // set by PreCommit
	txn    *txnDesc // desc decoded, set by PreCommit
	cp     uint64   // checkpoint id, set by PreCommit
	// onHalf is the engine's halfSent, called with the outcome of each
	// slot's half send (connection reader goroutines).
	onHalf func(sl *slot, h client.TxHandle, err error)

	mu struct {
		sync.Mutex
		err error // first send that failed for good
	}
}

func (ep *epochTxn) slot(i int) *slot { return &ep.chunks[i/chunkSize][i%chunkSize] }

func (ep *epochTxn) add(m *client.Message, lane uint32) int {
	if ep.n%chunkSize == 0 {
		ep.chunks = append(ep.chunks, new([chunkSize]slot))
	}
	i := ep.n
	ep.n++
	s := ep.slot(i)
	s.m, s.ep, s.lane, s.i = m, ep, lane, uint32(i)
	return i
}

// halfProps returns, in kv's array, the properties the engine adds to sl's
// half message sent as attempt try (1-based): the epoch and run, and for a
// scale-out task its task, owner epoch, slot and attempt. They go beside
// the message's own properties (Producer.SendHalfWith), not into its map,
// which would have to grow for them.
func (e *txEngine) halfProps(kv *[12]string, sl *slot, try uint32) []string {
	p := append(kv[:0], PropEpoch, sl.ep.tag, PropRun, e.run)
	if sc := e.scale; sc != nil {
		p = append(p, PropTask, sc.Task, PropOwner, e.ownerTag,
			propSlot, strconv.FormatUint(uint64(sl.i), 10), propTry, strconv.FormatUint(uint64(try), 10))
	}
	return p
}

// retried returns the slots whose accepted half message is not their first
// attempt's, with that attempt (1-based).
func (ep *epochTxn) retried() []retriedSlot {
	var rs []retriedSlot
	for i := range ep.n {
		if sl := ep.slot(i); sl.try > 0 {
			rs = append(rs, retriedSlot{slot: uint32(i), try: sl.try + 1})
		}
	}
	return rs
}

// handles returns the handles of the epoch's half messages, in write order.
func (ep *epochTxn) handles() []txnHandle {
	hs := make([]txnHandle, ep.n)
	for i := range ep.n {
		sl := ep.slot(i)
		hs[i] = txnHandle{h: sl.h, lane: sl.lane}
	}
	return hs
}

func (e *txEngine) openEpoch() *epochTxn {
	if e.open == nil {
		e.open = &epochTxn{epoch: e.epoch, tag: strconv.FormatUint(e.epoch, 10), onHalf: e.onHalf}
	}
	return e.open
}

// laneOf picks the commit lane of m: FNV-32a of its sharding key (else its
// first key), round robin for messages with neither.
func (e *txEngine) laneOf(m *client.Message) uint32 {
	k := m.ShardingKey
	if k == "" && len(m.Keys) > 0 {
		k = m.Keys[0]
	}
	if k == "" {
		e.rr++
		return e.rr % uint32(e.cfg.lanes)
	}
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h ^= uint32(k[i])
		h *= 16777619
	}
	return h % uint32(e.cfg.lanes)
}

// beforeWrite is Write's part before the record is mapped: it fails after
// a send failed for good, refreshes the open epoch when it nears the
// discard window, stops overlapping a slow commit, and bounds the epoch's
// size.
func (e *txEngine) beforeWrite(ctx context.Context) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := e.err(); err != nil {
		return err
	}
	ep := e.openEpoch()
	if err := e.refresh(ctx, ep); err != nil {
		return err
	}
	if e.inflight != nil && !ep.first.IsZero() && time.Since(ep.first) > e.cfg.discardWindow/4 {
		// The previous epoch's commit is slow (a pause, a loaded broker):
		// stop overlapping it before this epoch nears the discard window,
		// which would make it send everything again (refresh).
		if err := e.waitCommit(ctx); err != nil {
			return err
		}
	}
	if ep.n >= e.cfg.maxEpoch {
		return e.fail(fmt.Errorf("rocketmq sink: epoch %d holds more than %d records: checkpoint more often", ep.epoch, e.cfg.maxEpoch))
	}
	return nil
}

// write is Write's part after beforeWrite and the mapping: it adds m to
// the open epoch and sends it as a half message, asynchronously.
func (e *txEngine) write(ctx context.Context, m *client.Message) error {
	if m == nil {
		return errors.New("rocketmq sink: mapper returned a nil message")
	}
	ep := e.openEpoch() // opened by beforeWrite
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if ep.first.IsZero() {
		ep.first = time.Now()
	}
	i := ep.add(m, e.laneOf(m))
	e.enqueue(ep.slot(i))
	return nil
}

// tooOld reports whether an epoch that began at first is too close to the
// broker's discard window.
func (e *txEngine) tooOld(first time.Time) (time.Duration, bool) {
	if first.IsZero() {
		return 0, false
	}
	age := time.Since(first)
	return age, age > e.cfg.discardWindow*3/4
}

// refresh replaces the half messages of the open epoch when it has been
// open for three quarters of the discard window (the process was paused,
// or a checkpoint took that long): it rolls them all back (a half message
// the broker discarded counts as rolled back) and sends the epoch's records
// again as new half messages, so that none of them can be lost to the
// broker's discard. If the rollback fails the sink fails (ErrEpochTooOld).
func (e *txEngine) refresh(ctx context.Context, ep *epochTxn) error {
	age, old := e.tooOld(ep.first)
	if !old {
		return nil
	}
	if err := e.drain(ctx); err != nil {
		return err
	}
	if err := e.err(); err != nil {
		return err
	}
	e.log.Warn("rocketmq sink: epoch open too long for the broker's discard window; sending it again",
		"group", e.group, "epoch", ep.epoch, "age", age, "window", e.cfg.discardWindow, "records", ep.n)
	if _, err := e.lanes.endAll(ctx, ep.handles(), false, nil); err != nil {
		return e.fail(fmt.Errorf("%w: epoch %d open for %v (discard window %v): rolling back its half messages: %w",
			ErrEpochTooOld, ep.epoch, age.Round(time.Millisecond), e.cfg.discardWindow, err))
	}
	ep.first = time.Now()
	for i := range ep.n {
		select {
		case e.sem <- struct{}{}:
		case <-ctx.Done():
			return e.fail(fmt.Errorf("rocketmq sink: sending epoch %d again: %w", ep.epoch, ctx.Err()))
		}
		sl := ep.slot(i)
		sl.h = client.TxHandle{}
		e.enqueue(sl)
	}
	return nil
}
