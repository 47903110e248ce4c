package rocketmq

import (
	"context"
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/client"
)

// Half sends and their settlement. Every record of an epoch is sent once
// without waiting (enqueue); its outcome arrives on a connection reader
// goroutine (halfSent): acknowledged, or retried on a goroutine of the
// engine (resend), or failed for good (sendFailed), which fails the sink.
// Each send holds a token of e.sem until it is settled, so drain waits for
// every send of the epoch. Each synchronous attempt is bounded by
// e.lanes.timeout (WithTxSendTimeout), when set.

// enqueue sends sl (a slot of the open or refreshed epoch) as a half
// message without waiting for the broker (Producer.SendHalfAsyncTo, the
// slot receiving the outcome: see halfSent); the caller holds a sem token
// for it, released once the half message is acknowledged or failed for
// good. The request is bounded by the producer's send timeout (the
// client's request timeout, or WithTxSendTimeout's, given to the
// producer), not by a context per record.
func (e *txEngine) enqueue(sl *slot) {
	// Tagged as the slot's accepted attempt: the first for a new record; a
	// refreshed epoch's copy replaces its accepted one (rolled back) under
	// the same tag.
	var kv [12]string
	e.p.SendHalfAsyncWith(context.Background(), sl.m, e.halfProps(&kv, sl, sl.try+1), sl)
}

// halfSent is the outcome of sl's first half send (a connection reader
// goroutine, or enqueue's caller when it failed early). A failed first
// attempt is retried on a goroutine of the engine (resend).
func (e *txEngine) halfSent(sl *slot, h client.TxHandle, err error) {
	ep := sl.ep
	if err == nil && h.Status != client.SendOK {
		// Stored, but not on a slave (or not flushed) yet: rolled back and
		// sent again, as Apache RocketMQ's transactional producer rolls
		// such a half message back (not on a connection reader goroutine).
		err = notStoredWell(h)
		e.workers.Go(func() {
			e.rollBackStored(h)
			if e.cfg.attempts <= 1 {
				e.sendFailed(ep, sl, 1, err)
				return
			}
			e.resend(ep, sl, err)
		})
		return
	}
	if err == nil {
		sl.h = h
		e.hook(PhaseHalfSent, ep.epoch)
		<-e.sem
		return
	}
	if e.cfg.attempts <= 1 || !retryableSend(err) {
		e.sendFailed(ep, sl, 1, err)
		return
	}
	// MaybeApplied(err): an orphan half message may exist; it is rolled
	// back by its check-back (not part of the epoch).
	e.workers.Go(func() { e.resend(ep, sl, err) })
}

// warnResend logs that attempt (1-based) of a half send of ep failed with
// err and is tried again.
func (e *txEngine) warnResend(ep *epochTxn, attempt int, err error) {
	e.log.Warn("rocketmq sink: half message send failed; retrying", "group", e.group, "epoch", ep.epoch,
		"attempt", attempt, "of", e.cfg.attempts, "err", err)
}

// retryableSend reports whether a failed half send is tried again.
func retryableSend(err error) bool {
	return !errors.Is(err, client.ErrInvalidMessage) && !errors.Is(err, client.ErrClosed)
}

// resend sends sl again after its first attempt failed with err, with
// backoff, synchronously (an engine goroutine), and releases the slot's sem
// token. It touches only *sl and ep.mu.
func (e *txEngine) resend(ep *epochTxn, sl *slot, err error) {
	ctx := context.Background() // bounded per attempt; the sink's retries bound the whole
	e.warnResend(ep, 1, err)
	if err = backoff.Sleep(ctx, e.cfg.retry.Delay(0)); err == nil {
		err = backoff.Retry(ctx, e.cfg.retry, e.cfg.attempts-1, retryableSend, func(i int) error {
			actx, cancel := attemptCtx(ctx, e.lanes.timeout)
			defer cancel()
			var kv [12]string
			h, err := e.p.SendHalfWith(actx, sl.m, e.halfProps(&kv, sl, uint32(i+2)))
			if err == nil && h.Status != client.SendOK {
				e.rollBackStored(h)
				err = notStoredWell(h)
			}
			if err != nil {
				if i+2 < e.cfg.attempts && retryableSend(err) {
					e.warnResend(ep, i+2, err)
				}
				return err
			}
			sl.h, sl.try = h, uint32(i+1)
			return nil
		})
	}
	if err != nil {
		e.sendFailed(ep, sl, e.cfg.attempts, err)
		return
	}
	e.hook(PhaseHalfSent, ep.epoch)
	<-e.sem
}

// errNotStoredWell is the error of a half send the broker answered with a
// status other than SEND_OK (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
// SLAVE_NOT_AVAILABLE): stored on the master only, or not yet on its disk,
// so not durable as the broker is configured to promise; it is sent again.
var errNotStoredWell = errors.New("rocketmq sink: half message stored without the durability the broker promises")

func notStoredWell(h client.TxHandle) error {
	return fmt.Errorf("%w (%s, message %s on %s)", errNotStoredWell, h.Status, h.MsgID, h.BrokerName)
}

// rollBackStored rolls back a half message stored with a status other than
// SEND_OK (an engine goroutine). Should the rollback fail, the half message
// is an orphan of its slot (not its accepted attempt): its check-back
// answer is rollback.
func (e *txEngine) rollBackStored(h client.TxHandle) {
	ctx, cancel := attemptCtx(context.Background(), e.lanes.timeout)
	defer cancel()
	if err := e.p.EndTransaction(ctx, h, false); err != nil {
		e.log.Warn("rocketmq sink: rolling back a half message stored without its durability failed; its check-back rolls it back",
			"group", e.group, "msgId", h.MsgID, "status", h.Status, "err", err)
	}
}

// sendFailed records the failure of sl's half send after tries attempts
// (the sink fails) and releases the slot's sem token.
func (e *txEngine) sendFailed(ep *epochTxn, sl *slot, tries int, err error) {
	err = fmt.Errorf("rocketmq sink: half message of epoch %d to %s failed after %d attempts: %w", ep.epoch, sl.m.Topic, tries, err)
	ep.mu.Lock()
	if ep.mu.err == nil {
		ep.mu.err = err
	}
	ep.mu.Unlock()
	e.fail(err)
	<-e.sem
}

// drain waits until no half send is in flight.
func (e *txEngine) drain(ctx context.Context) error { return drainSem(ctx, e.sem, "half sends") }

// sendAgain sends m (the record of a discarded half message) as a new half
// message and commits it at once (the lane committer's goroutine of its
// lane, before the lane's next half message).
func (e *txEngine) sendAgain(ctx context.Context, sl *slot) error {
	var h client.TxHandle
	err := backoff.Retry(ctx, e.cfg.retry, e.cfg.attempts, nil, func(int) error {
		actx, cancel := attemptCtx(ctx, e.lanes.timeout)
		defer cancel()
		// Tagged as the slot's accepted attempt, whose copy the broker
		// discarded.
		var kv [12]string
		var err error
		h, err = e.p.SendHalfWith(actx, sl.m, e.halfProps(&kv, sl, sl.try+1))
		return err
	})
	if err != nil {
		return fmt.Errorf("rocketmq sink: sending a discarded record again: %w", err)
	}
	if err := e.lanes.endOne(ctx, &h, true); err != nil {
		return fmt.Errorf("rocketmq sink: committing a discarded record sent again: %w", err)
	}
	return nil
}
