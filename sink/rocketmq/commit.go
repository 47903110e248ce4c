package rocketmq

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/runnel-dev/runnel/internal/failpoint"
)

// Pre-commit, the commits and abort. PreCommit seals the open epoch into a
// transaction description; StartCommit hands a durable checkpoint's
// transaction to a committer goroutine (one at a time: commits happen in
// checkpoint order), which ends its half messages through the lane
// committer; waitCommit joins it and does the bookkeeping on the task
// goroutine.

// preCommit implements PreCommit.
func (e *txEngine) preCommit(ctx context.Context, id uint64) ([]byte, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if n := len(e.sealed); n > 0 && e.sealed[n-1].cp == id {
		return e.sealed[n-1].desc, nil
	}
	if err := e.waitCommit(ctx); err != nil {
		return nil, err
	}
	if err := e.err(); err != nil {
		return nil, err
	}
	if err := e.drain(ctx); err != nil {
		return nil, err
	}
	if err := e.err(); err != nil {
		return nil, err
	}
	ep := e.openEpoch()
	if err := e.refresh(ctx, ep); err != nil {
		return nil, err
	}
	if err := e.drain(ctx); err != nil {
		return nil, err
	}
	if err := e.err(); err != nil {
		return nil, err
	}
	d := &txnDesc{checkpoint: id, run: e.run, epoch: ep.epoch, handles: ep.handles(), retried: ep.retried()}
	// Where a restore looks for what the commit of d stored (floors.go).
	floors, err := e.floors.floorsOf(ctx, d.handles)
	if err != nil {
		return nil, e.fail(err)
	}
	d.floors = floors
	ep.desc = appendTxn(make([]byte, 0, 64+48*ep.n), d)
	ep.txn, ep.cp = d, id
	e.view.sealed(d)
	e.sealed = append(e.sealed, ep)
	e.open = nil
	e.epoch = max(ep.epoch, id) + 1
	if failpoint.Enabled && e.cfg.faults.CommitBeforeDurable {
		if _, err := e.lanes.endAll(ctx, d.handles, true, nil); err != nil {
			return nil, e.fail(err)
		}
	}
	e.floors.refresh()
	e.hook(PhasePreCommitted, ep.epoch)
	return ep.desc, nil
}

// startCommit implements StartCommit.
func (e *txEngine) startCommit(ctx context.Context, txn []byte) error {
	if err := e.usable(); err != nil {
		return err
	}
	// The transaction of an epoch this run pre-committed is known decoded
	// (the description is compared, not decoded again).
	var ep *epochTxn
	var d *txnDesc
	for _, s := range e.sealed {
		if bytes.Equal(s.desc, txn) {
			ep, d = s, s.txn
			break
		}
	}
	if d == nil {
		var err error
		if d, err = decodeTxn(txn); err != nil {
			return err
		}
		if d.run == e.run {
			for _, s := range e.sealed {
				if s.epoch == d.epoch {
					ep = s
					break
				}
			}
		}
	}
	// The wait is bounded by the retries of the commit in flight; it
	// ignores cancellation so that a job stopping during its restore does
	// not fail for it.
	if err := e.waitCommit(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	key := txKey(d.run, d.epoch)
	if e.done[key] {
		return nil
	}
	if err := e.err(); err != nil {
		return fmt.Errorf("%w: %w", ErrCommitOrder, err)
	}
	e.view.durable(d)
	job := &commitJob{key: key, ep: ep, done: make(chan struct{})}
	e.inflight = job
	go func() {
		defer close(job.done)
		job.err = e.commit(d, ep)
	}()
	return nil
}

// waitCommits implements WaitCommits.
func (e *txEngine) waitCommits(ctx context.Context) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := e.waitCommit(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	return e.err()
}

// commitJob is a transaction being committed by the engine's committer
// goroutine (started by startCommit; waitCommits, the next startCommit,
// preCommit and close wait for it).
type commitJob struct {
	key  string
	ep   *epochTxn
	done chan struct{}
	err  error // set before done is closed
}

// maxDone bounds the memory of committed transactions.
const maxDone = 1024

// waitCommit waits for the commit in flight (if any) and does its
// bookkeeping on the task goroutine.
func (e *txEngine) waitCommit(ctx context.Context) error {
	job := e.inflight
	if job == nil {
		return nil
	}
	select {
	case <-job.done:
	case <-ctx.Done():
		return fmt.Errorf("rocketmq sink: waiting for the commit in flight: %w", ctx.Err())
	}
	e.inflight = nil
	if job.err != nil {
		return job.err
	}
	if len(e.done) >= maxDone {
		clear(e.done) // a repeated Commit then ends its half messages again: harmless
	}
	e.done[job.key] = true
	if job.ep != nil {
		kept := e.sealed[:0]
		for _, s := range e.sealed {
			if s != job.ep {
				kept = append(kept, s)
			}
		}
		clear(e.sealed[len(kept):])
		e.sealed = kept
	}
	return nil
}

// commit ends every half message of d with commit (committer goroutine).
// ep is the epoch's memory when this run sent it (nil after a restart).
func (e *txEngine) commit(d *txnDesc, ep *epochTxn) error {
	ctx := context.Background() // bounded by the retries; close waits for it
	if ep != nil {
		e.hook(PhaseCommitStart, d.epoch)
	} else {
		e.hook(PhaseRecoverCommit, d.epoch)
	}
	var again againFunc
	if ep != nil && ep.n == len(d.handles) {
		var warned atomic.Bool
		again = func(ctx context.Context, i int) error {
			if !warned.Swap(true) {
				e.log.Warn("rocketmq sink: half messages discarded by the broker (paused past its discard window); sending them again in lane order",
					"group", e.group, "epoch", d.epoch)
			}
			return e.sendAgain(ctx, ep.slot(i))
		}
	}
	hs := d.handles
	if ep == nil && !(failpoint.Enabled && e.cfg.faults.BlindRestoreCommit) {
		// A transaction this process did not send: the run that sent it
		// may have committed some or all of it (restorecheck.go).
		var err error
		if hs, err = e.uncommitted(ctx, d); err != nil {
			return e.fail(fmt.Errorf("rocketmq sink: commit of checkpoint %d (epoch %d, %d records): %w", d.checkpoint, d.epoch, len(d.handles), err))
		}
	}
	ended := make([]bool, len(hs))
	var v *endVerifier
	if d.floors != nil && !(failpoint.Enabled && e.cfg.faults.BlindEndRetry) {
		v = &endVerifier{e: e, d: d}
	}
	// endAll returns discarded half messages only when again is nil.
	discarded, err := e.lanes.endAllTracked(ctx, hs, true, again, ended, v)
	if err == nil && len(discarded) > 0 {
		err = errDiscardedNoCopy(d, hs, discarded)
	}
	if err != nil {
		e.view.commitFailed(d, hs, ended)
		return e.fail(fmt.Errorf("rocketmq sink: commit of checkpoint %d (epoch %d, %d records): %w", d.checkpoint, d.epoch, len(d.handles), err))
	}
	e.hook(PhaseCommitEnded, d.epoch)
	e.view.forget(d)
	return nil
}

// errDiscardedNoCopy is the error of a commit that found half messages
// discarded and has no copy of their records (the epoch was sent by an
// earlier run): an operator must act (see ErrDiscarded).
func errDiscardedNoCopy(d *txnDesc, hs []txnHandle, discarded []int) error {
	ids := make([]string, 0, min(len(discarded), 20))
	for _, i := range discarded[:min(len(discarded), 20)] {
		ids = append(ids, hs[i].h.MsgID)
	}
	return fmt.Errorf("%w: %d of checkpoint %d (epoch %d of run %s), no copy in this process; first ids %s (see TRANS_CHECK_MAX_TIME_TOPIC)",
		ErrDiscarded, len(discarded), d.checkpoint, d.epoch, d.run, strings.Join(ids, ","))
}

// abort implements Abort.
func (e *txEngine) abort(ctx context.Context, txn []byte) error {
	if err := e.usable(); err != nil {
		return err
	}
	d, err := decodeTxn(txn)
	if err != nil {
		return err
	}
	if err := e.waitCommit(ctx); err != nil {
		return err
	}
	if _, err := e.lanes.endAll(ctx, d.handles, false, nil); err != nil {
		return fmt.Errorf("rocketmq sink: abort of checkpoint %d: %w", d.checkpoint, err)
	}
	e.view.forget(d)
	return nil
}

// flush implements Flush.
func (e *txEngine) flush(ctx context.Context) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := e.drain(ctx); err != nil {
		return err
	}
	if err := e.waitCommit(ctx); err != nil {
		return err
	}
	return e.err()
}
