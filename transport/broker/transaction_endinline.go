// END_TRANSACTION served on the connection's reader goroutine when it
// cannot block (processEndInline), and the hand-off of one that may block
// to a handler goroutine, with the pooled pendingEnd that carries it.

package broker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// processEndInline serves END_TRANSACTION on the connection's reader
// goroutine when it needs nothing that blocks: a half message this process
// keeps (not being ended by anyone else) whose outcome is known in memory
// is checked at once and its final message and op record go to the store's
// committer, which answers the request once they are stored. Anything
// else (another end of the same half message in progress, a record not
// kept or an outcome to look up in the store, a final message whose store
// path may block) is handed to a broker goroutine running processEnd.
func (t *transactions) processEndInline(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.EndTransactionRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	if h.CommitOrRollback != protocol.SysFlagTransactionCommit && h.CommitOrRollback != protocol.SysFlagTransactionRollback {
		return t.processEnd(ctx, rc) // no response, as from Java
	}
	if !t.b.running() {
		return respond(req, protocol.ResServiceNotAvailable, "broker is shutting down"), nil
	}
	if t.b.isSlave() {
		return respond(req, protocol.ResSlaveNotAvailable, slaveRefusesEnd), nil
	}
	want := txRolledBack
	if h.CommitOrRollback == protocol.SysFlagTransactionCommit {
		want = txCommitted
	}
	if resp, ok := t.endInline(ctx, rc, &h, want); ok {
		return resp, nil
	}
	return t.handOffEnd(ctx, rc)
}

// endInline is processEndInline's non-blocking path. ok is false when
// nothing was done (the caller hands the request off); otherwise resp is
// the answer, or nil after rc.Defer (the store's committer answers).
func (t *transactions) endInline(ctx context.Context, rc *remoting.RequestCtx, h *protocol.EndTransactionRequestHeader, want txState) (resp *protocol.Command, ok bool) {
	req := rc.Request()
	phys := h.CommitLogOffset
	rec, kept := t.cachedHalf(h.TranStateTableOffset, phys)
	if !kept || !t.tryLock(phys) {
		return nil, false
	}
	locked := true
	defer func() {
		if locked {
			t.unlock(phys)
		}
	}()
	half, _, err := protocol.DecodeRecord(rec)
	if err != nil || half.CommitLogOffset != phys {
		return nil, false // processEnd reports it and reads the store
	}
	if err := checkHalf(&half, h); err != nil {
		return errorResponse(req, err), true
	}
	st, known := t.knownState(half.QueueOffset)
	if !known {
		return nil, false
	}
	if done, err := t.alreadyEnded(&half, st, want); done {
		if err != nil {
			return errorResponse(req, err), true
		}
		return protocol.NewResponse(req, protocol.ResSuccess, ""), true
	}
	pe := t.ends.Get().(*pendingEnd)
	pe.t = t
	msgs, err := t.endRecords(ctx, &half, want, rc, true, &pe.sc)
	if errors.Is(err, errEndMayBlock) {
		pe.release()
		return nil, false
	}
	if err != nil {
		pe.release()
		return errorResponse(req, err), true
	}
	pe.rc, pe.half, pe.want = rc, half, want
	rc.Defer()
	if err := pe.put(ctx, msgs, want == txCommitted && len(msgs) == 1); err != nil {
		_ = rc.Respond(errorResponse(req, storeError(err))) // a failure closed the connection, which reports it
		pe.release()
		return nil, true
	}
	locked = false // pe.done unlocks
	return nil, true
}

// pendingEnd is an END_TRANSACTION whose records are in a store round:
// done (on the store's committer) records the end, releases the half
// message and answers.
//
// They are pooled (transactions.ends): done releases its own.
type pendingEnd struct {
	t      *transactions
	rc     *remoting.RequestCtx
	half   protocol.MessageExt
	want   txState
	buf    *[]byte
	puts   [2]store.PutMessage
	res    [2]store.PutResult
	n      int // records in the round
	keys   [2][4]string
	sc     endScratch  // the records endRecords built
	doneFn func(error) // pe.done, bound once
}

func newPendingEnd() any {
	pe := &pendingEnd{}
	pe.doneFn = pe.done
	return pe
}

// release clears pe and returns it to the pool.
func (pe *pendingEnd) release() {
	t, done := pe.t, pe.doneFn
	*pe = pendingEnd{sc: endScratch{props: pe.sc.props[:0]}, doneFn: done} // the properties buffer is kept
	t.ends.Put(pe)
}

// put encodes msgs and hands them to the store's committer as one atomic
// round. With commit, msgs is the final message alone: its UNIQ_KEY index
// entry marks the commit; when that is not indexed, it is indexed under
// commitKey as well, or, when it has no room for another index key, an op
// record is stored with it. On error nothing was queued (done will not
// run).
func (pe *pendingEnd) put(ctx context.Context, msgs []*InboundMessage, commit bool) error {
	b := pe.t.b
	var finalKeys []string // the final message's keys, commitKey included
	if commit {
		finalKeys = appendIndexKeys(pe.keys[0][:0], msgs[0].Properties)
		// state finds the final message by its UNIQ_KEY when it is indexed.
		if uniq := pe.half.UniqKey(); uniq == "" || !slices.Contains(finalKeys, uniq) {
			if len(finalKeys) < store.MaxKeysPerMessage {
				finalKeys = append(finalKeys, commitKey(pe.half.QueueOffset))
			} else {
				msgs = append(msgs[:1:1], pe.t.opRecord(pe.half.QueueOffset, txCommitted))
			}
		}
	}
	pe.buf = b.getBuf()
	buf := (*pe.buf)[:0]
	var ends, ts [2]int
	for i, m := range msgs {
		var err error
		if buf, ts[i], err = b.encodeRecord(buf, m); err != nil {
			*pe.buf = buf
			b.putBuf(pe.buf)
			return err
		}
		ends[i] = len(buf)
	}
	*pe.buf = buf
	start := 0
	for i, m := range msgs {
		// Each message's keys on their own: the per-message cap must not
		// count the keys of the message before.
		keys := finalKeys
		if i > 0 || !commit {
			keys = appendIndexKeys(pe.keys[i][:0], m.Properties)
		}
		pe.puts[i] = store.PutMessage{
			Topic:             m.Topic,
			QueueID:           m.QueueID,
			Record:            buf[start:ends[i]:ends[i]],
			StoreTimestampPos: ts[i],
			TagsCode:          tagsCode(m.Properties),
			Keys:              keys,
		}
		start = ends[i]
	}
	n := len(msgs)
	pe.n = n
	if err := b.store.PutAsync(ctx, pe.puts[:n], pe.res[:n], pe.doneFn); err != nil {
		b.putBuf(pe.buf)
		return err
	}
	return nil
}

func (pe *pendingEnd) done(err error) {
	t, req := pe.t, pe.rc.Request()
	t.b.putBuf(pe.buf)
	var resp *protocol.Command
	if err != nil {
		resp = errorResponse(req, storeError(err))
	} else {
		t.ended(&pe.half, pe.want)
		t.inlineEnds.Add(1)
		resp = protocol.NewResponse(req, protocol.ResSuccess, "")
		props := ""
		if pe.want == txCommitted {
			props = pe.sc.final.Properties
		}
		if pe.n > 0 && t.b.syncMasterWait(props) {
			// Java's end waits for the replica, then answers SUCCESS
			// whatever the slave did.
			end := pe.res[pe.n-1].PhysicalOffset + int64(len(pe.puts[pe.n-1].Record))
			t.unlock(pe.half.CommitLogOffset)
			t.b.awaitReplica(end, pe.rc, resp, true)
			pe.release()
			return
		}
	}
	t.unlock(pe.half.CommitLogOffset)
	_ = pe.rc.Respond(resp) // a failure closed the connection, which reports it
	pe.release()
}

// handOffEnd serves the END_TRANSACTION rc on a goroutine the broker owns
// (processEnd), answering from there. It waits for a hand-off slot (shared
// with the send path) or for ctx, the connection's lifetime, to end.
func (t *transactions) handOffEnd(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	b := t.b
	select {
	case b.handOffs <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("broker: end transaction: %w", ctx.Err())
	}
	rc.Defer()
	// The remoting server joins its processors before stop joins b.wg, so
	// this Add never races with that Wait.
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() { <-b.handOffs }()
		if resp := t.endHandedOff(ctx, rc); resp != nil {
			_ = rc.Respond(resp) // a failure closed the connection, which reports it
		}
	}()
	return nil, nil
}

// endHandedOff runs processEnd, turning a panic into the response (as the
// remoting server does for its processors).
func (t *transactions) endHandedOff(ctx context.Context, rc *remoting.RequestCtx) (resp *protocol.Command) {
	req := rc.Request()
	defer func() {
		if r := recover(); r != nil {
			t.log.Error("broker: end transaction panicked", "panic", r, "stack", string(debug.Stack()))
			resp = respond(req, protocol.ResSystemError, fmt.Sprintf("broker: end transaction panic: %v", r))
		}
	}()
	resp, _ = t.processEnd(ctx, rc) // processEnd answers every error itself
	return resp
}
