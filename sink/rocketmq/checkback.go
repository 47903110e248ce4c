package rocketmq

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/jobinfo"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Check-back answers. The broker asks a producer of the sink's group about
// a half message left pending past its transaction timeout; the engine
// answers with what its txDecider decides. Today that is the local view:
// what this process learnt from Recover, PreCommit and its commits (see
// "Check-back answers" and "What the check-back answer assumes" in the
// package documentation). A decider backed by a commit record that every
// worker of a job can read replaces it without touching the rest of the
// engine: it sees the same halfQuery and gives the same three answers.

// halfQuery is what a check-back is decided from: the half message's run
// (PropRun), epoch (PropEpoch) and id (its UNIQ_KEY), and the message
// itself, valid only during the decision, for deciders that need more of
// its properties.
type halfQuery struct {
	run   string
	epoch uint64
	msgID string
	msg   *protocol.MessageExt
}

// queryOf returns the check-back query of the half message m.
func queryOf(m *protocol.MessageExt) halfQuery {
	run, _ := m.Property(PropRun)
	ep, _ := m.Property(PropEpoch)
	epoch, _ := strconv.ParseUint(ep, 10, 64)
	return halfQuery{run: run, epoch: epoch, msgID: m.UniqKey(), msg: m}
}

// txDecider decides the answer to a check-back: client.TxCommit,
// client.TxRollback, or client.TxUnknown (the broker asks again later).
// It is called on connection handler goroutines, concurrently with the
// engine; ctx ends when the check-back's connection closes.
type txDecider interface {
	decide(ctx context.Context, q halfQuery) client.TxState
}

// checkBack is the producer's check listener: it answers the broker's
// check-back of a half message of the sink's group (connection handler
// goroutine).
func (e *txEngine) checkBack(ctx context.Context, m *protocol.MessageExt) client.TxState {
	q := queryOf(m)
	e.hook(PhaseCheckBack, q.epoch)
	st := e.decider.decide(ctx, q)
	e.log.Debug("rocketmq sink: check-back", "group", e.group, "msgId", q.msgID, "run", q.run, "epoch", q.epoch, "answer", st)
	return st
}

// knownState is what the local view knows of a half message.
type knownState uint8

const (
	knownSealed    knownState = iota + 1 // pre-committed, checkpoint in flight
	knownDurable                         // listed by a durable checkpoint, commit pending or running
	knownCommitErr                       // durable, but this process failed to commit it
)

// localView is this process's knowledge of the sink's half messages, fed
// by the engine (task and committer goroutines) and read by check-backs:
// the txDecider of a job run by one process at a time.
type localView struct {
	run string // this process's run id

	mu struct {
		sync.Mutex
		restored   bool   // Recover was called
		sealedUpTo uint64 // highest epoch of this run pre-committed
		known      map[string]knownState
		// ended holds the transactions (txKey) this process committed or
		// aborted, the last maxEnded of them (endedRing, oldest at
		// endedNext): a check-back of one of their half messages may still
		// come (Apache RocketMQ 5.x writes its "ended" records in
		// batches), and committing it again would store it twice.
		ended     map[string]struct{}
		endedRing []string
		endedNext int
	}
}

// maxEnded bounds the ended transactions a view remembers.
const maxEnded = 4096

func newLocalView(run string) *localView {
	v := &localView{run: run}
	v.mu.known = make(map[string]knownState)
	v.mu.ended = make(map[string]struct{})
	return v
}

// own answers a check-back from what this process did with the half
// message, when it did anything: unknown while it is about to commit it
// or committing it, commit for one whose commit failed here (and that no
// END_TRANSACTION ended), rollback for a half message of a transaction it
// committed or aborted (a no-op for the broker when it is committed; an
// orphan of the transaction otherwise). ok is false when this process
// knows nothing of it.
func (v *localView) own(q halfQuery) (st client.TxState, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ownLocked(q)
}

func (v *localView) ownLocked(q halfQuery) (client.TxState, bool) {
	if k, ok := v.mu.known[q.msgID]; ok {
		if k == knownCommitErr {
			return client.TxCommit, true
		}
		return client.TxUnknown, true
	}
	if _, ok := v.mu.ended[txKey(q.run, q.epoch)]; ok {
		return client.TxRollback, true
	}
	return client.TxUnknown, false
}

// decide implements txDecider (the rules are listed under "Check-back
// answers" in the package documentation).
func (v *localView) decide(_ context.Context, q halfQuery) client.TxState {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.mu.restored {
		return client.TxUnknown
	}
	if st, ok := v.ownLocked(q); ok {
		return st
	}
	if q.run == v.run && q.epoch > v.mu.sealedUpTo {
		return client.TxUnknown // the open epoch
	}
	return client.TxRollback
}

// restore records the transactions a restored checkpoint lists (durable,
// about to be committed) and starts the answers (Recover).
func (v *localView) restore(ds []*txnDesc) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, d := range ds {
		v.markLocked(d, knownDurable)
	}
	v.mu.restored = true
}

// sealed records that this run pre-committed d (PreCommit).
func (v *localView) sealed(d *txnDesc) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.markLocked(d, knownSealed)
	v.mu.sealedUpTo = d.epoch
}

// durable records that d is listed by a durable checkpoint and its commit
// starts (StartCommit).
func (v *localView) durable(d *txnDesc) { v.mark(d, knownDurable) }

// commitFailed records that this process failed to commit d, durable,
// after trying the handles hs (all of d's but those a restore found
// committed), of which those marked in ended were committed: a check-back
// commits the others and rolls back (a no-op) the committed ones.
func (v *localView) commitFailed(d *txnDesc, hs []txnHandle, ended []bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range d.handles {
		delete(v.mu.known, d.handles[i].h.MsgID)
	}
	for i := range hs {
		if !ended[i] {
			v.mu.known[hs[i].h.MsgID] = knownCommitErr
		}
	}
}

// forget drops d's half messages, committed or aborted, and remembers d as
// ended: a check-back of one of them is answered rollback.
func (v *localView) forget(d *txnDesc) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range d.handles {
		delete(v.mu.known, d.handles[i].h.MsgID)
	}
	k := txKey(d.run, d.epoch)
	if _, ok := v.mu.ended[k]; ok {
		return
	}
	if len(v.mu.endedRing) < maxEnded {
		v.mu.endedRing = append(v.mu.endedRing, k)
	} else {
		delete(v.mu.ended, v.mu.endedRing[v.mu.endedNext])
		v.mu.endedRing[v.mu.endedNext] = k
		v.mu.endedNext = (v.mu.endedNext + 1) % maxEnded
	}
	v.mu.ended[k] = struct{}{}
}

func (v *localView) mark(d *txnDesc, k knownState) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.markLocked(d, k)
}

func (v *localView) markLocked(d *txnDesc, k knownState) {
	for i := range d.handles {
		v.mu.known[d.handles[i].h.MsgID] = k
	}
}

// chainDecider answers the check-backs of a scale-out task's sink from the
// job's commit chains (jobinfo.Chains), which every worker reads, since the
// broker may ask any worker's producer of the group about any task's half
// message (see "Scale-out" in the package documentation):
//   - a half message this worker's sink is committing, or committed or
//     aborted: as its localView answers (localView.own);
//   - a half message without a task (of a run of the job in one process):
//     rollback, as localView answers for another run;
//   - its task's chain says its (owner epoch, epoch) never counts: rollback;
//   - not decided yet, or the chain cannot tell: unknown (asked later);
//   - valid: rollback for an orphan (a send attempt other than the one the
//     broker acknowledged for its slot, per the checkpoint's TxnInfo);
//     unknown for the accepted copy while it is younger than half the
//     discard window (its owner, or its task's next owner, commits it in
//     lane order), commit after that; unknown when the chains do not
//     remember the checkpoint's information (its new owner commits it on
//     restore).
type chainDecider struct {
	chains jobinfo.Chains
	sink   string     // the sink's UID
	view   *localView // this sink's own view, asked first
	// patience is how long a valid half message is left to its owner
	// before a check-back commits it (half the discard window).
	patience time.Duration
}

func (d *chainDecider) decide(_ context.Context, q halfQuery) client.TxState {
	// What this worker's sink did with the half message decides first: it
	// must not answer commit for one it committed (Apache RocketMQ 5.x
	// checks back ended half messages whose "ended" record is not written
	// yet, and stores a commit answer again) nor take over one it is
	// committing.
	if st, ok := d.view.own(q); ok {
		return st
	}
	task, _ := q.msg.Property(PropTask)
	if task == "" {
		return client.TxRollback
	}
	ownerS, _ := q.msg.Property(PropOwner)
	owner, err := strconv.ParseUint(ownerS, 10, 64)
	if err != nil {
		return client.TxUnknown
	}
	v, err := d.chains.Decide(task, owner, q.epoch)
	switch {
	case err != nil:
		return client.TxUnknown
	case v == jobinfo.Invalid:
		return client.TxRollback
	case v != jobinfo.Valid:
		return client.TxUnknown
	}
	info, ok := d.chains.SinkInfo(task, d.sink, q.epoch)
	if !ok {
		return client.TxUnknown
	}
	slotS, _ := q.msg.Property(propSlot)
	tryS, _ := q.msg.Property(propTry)
	slot, err1 := strconv.ParseUint(slotS, 10, 32)
	try, err2 := strconv.ParseUint(tryS, 10, 32)
	if err1 != nil || err2 != nil {
		return client.TxUnknown
	}
	accepted, err := acceptedTry(info, uint32(slot))
	if err != nil {
		return client.TxUnknown
	}
	if uint32(try) != accepted {
		return client.TxRollback
	}
	// The accepted copy of a published checkpoint's record: its task's
	// owner ends it (or, after a failover, the new owner, which restores
	// the checkpoint's pending transactions and commits them in lane
	// order). Committing it from here as well would let it overtake the
	// lane's earlier records, so only a half message nobody ended for half
	// the broker's discard window is committed here: its owner is gone for
	// long, and waiting longer would let the broker discard it.
	if age := time.Since(time.UnixMilli(q.msg.BornTimestamp)); age < d.patience {
		return client.TxUnknown
	}
	return client.TxCommit
}

// txnInfo is the check-back information of a transaction description
// (jobinfo.TxnInfoer): "RI" 0x01, uvarint slots, uvarint count, then per
// retried slot uvarint slot and uvarint accepted attempt.
func txnInfo(txn []byte) ([]byte, error) {
	d, n, err := decodeTxnAs(txn, false)
	if err != nil {
		return nil, err
	}
	b := []byte{'R', 'I', 1}
	b = binary.AppendUvarint(b, uint64(n))
	b = binary.AppendUvarint(b, uint64(len(d.retried)))
	for _, r := range d.retried {
		b = binary.AppendUvarint(b, uint64(r.slot))
		b = binary.AppendUvarint(b, uint64(r.try))
	}
	return b, nil
}

// acceptedTry returns the attempt (1-based) the broker acknowledged for
// slot, per info; an error for a slot the transaction does not have.
func acceptedTry(info []byte, slot uint32) (uint32, error) {
	if len(info) < 3 || info[0] != 'R' || info[1] != 'I' || info[2] != 1 {
		return 0, fmt.Errorf("%w: bad check-back information", ErrBadTxn)
	}
	r := &txnReader{b: info[3:]}
	n := r.uvarint("slots", 1<<32)
	k := r.uvarint("retried", n)
	if r.err != nil {
		return 0, r.err
	}
	if uint64(slot) >= n {
		return 0, fmt.Errorf("%w: slot %d of %d", ErrBadTxn, slot, n)
	}
	for range k {
		s, t := r.uvarint("slot", n), r.uvarint("attempt", 1<<16)
		if r.err != nil {
			return 0, r.err
		}
		if uint32(s) == slot {
			return uint32(t), nil
		}
	}
	return 1, nil
}
