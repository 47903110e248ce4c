package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The lane committer ends the half messages of a transaction (commit, or
// rollback for an abort or a refresh): lanes in parallel, each lane in
// write order. One END_TRANSACTION per lane is in flight at a time,
// pipelined on the broker connection and answered on its reader goroutine;
// a lane's next is sent once the previous one is answered, so a broker that
// processes requests in parallel still ends a lane in order. A lane whose
// END_TRANSACTION fails is handed over, from that handle, to a goroutine of
// its own that retries with backoff (synchronous requests, still in order),
// while the other lanes go on; once one answer failed (the broker may be
// gone, and a pipelined send waits for its connection: a dial window each,
// one lane after another), every lane's next request is handed over the
// same way. The first lane that fails for good stops the others.

// endSender sends END_TRANSACTION requests: what the lane committer needs
// of a producer (*client.Producer implements it). EndTransactionAsync calls
// cb once with the answer, on a connection reader goroutine or before it
// returns.
type endSender interface {
	EndTransactionAsync(ctx context.Context, h client.TxHandle, commit bool, cb func(error))
	EndTransaction(ctx context.Context, h client.TxHandle, commit bool) error
}

var _ endSender = (*client.Producer)(nil)

// errLostAnswer is the error of an END_TRANSACTION commit whose answer
// failpoint.Tx.LoseEndAnswers dropped (the broker did commit).
var errLostAnswer = errors.New("rocketmq sink: END_TRANSACTION answer lost (test fault)")

// lostAnswers is an endSender that reports the first n successful commits
// as failed with errLostAnswer (failpoint.Tx.LoseEndAnswers).
type lostAnswers struct {
	endSender
	n atomic.Int64
}

func (l *lostAnswers) lose(commit bool, err error) error {
	if commit && err == nil && l.n.Add(-1) >= 0 {
		return errLostAnswer
	}
	return err
}

func (l *lostAnswers) EndTransactionAsync(ctx context.Context, h client.TxHandle, commit bool, cb func(error)) {
	l.endSender.EndTransactionAsync(ctx, h, commit, func(err error) { cb(l.lose(commit, err)) })
}

func (l *lostAnswers) EndTransaction(ctx context.Context, h client.TxHandle, commit bool) error {
	return l.lose(commit, l.endSender.EndTransaction(ctx, h, commit))
}

// againFunc sends the record of the discarded half message hs[i] of a
// commit again and commits it, before its lane's next half message (see
// laneCommitter.endAll).
type againFunc func(ctx context.Context, i int) error

// laneCommitter ends half messages through end, with retries. It holds no
// state between calls: endAll may run concurrently with endOne (a refresh
// does not overlap a commit, but sendAgain runs inside a commit's endAll).
type laneCommitter struct {
	end      endSender
	attempts int            // tries per END_TRANSACTION
	retry    backoff.Policy // between tries
	timeout  time.Duration  // per request (WithTxSendTimeout); 0: the client's request timeout
	log      *slog.Logger
	group    string // the producer group, for logs
}

var (
	// errDiscardedHalf marks an END_TRANSACTION refused because the broker
	// discarded the half message.
	errDiscardedHalf = errors.New("half message discarded")
	// errAbortCommitted marks a rollback refused because the half message
	// was committed.
	errAbortCommitted = errors.New("rocketmq sink: abort of committed half message")
)

// classifyEnd names the broker's refusals of an END_TRANSACTION of h that
// no retry can change: errDiscardedHalf, ErrRolledBack (commit of a
// rolled-back half message), abort of a committed one.
func classifyEnd(err error, h *client.TxHandle, commit bool) error {
	var pe *protocol.Error
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	switch {
	case strings.Contains(pe.Remark, "ended with discard"):
		return errDiscardedHalf
	case commit && strings.Contains(pe.Remark, "ended with rollback"):
		return fmt.Errorf("%w: %s: %w", ErrRolledBack, h.MsgID, err)
	case !commit && strings.Contains(pe.Remark, "ended with commit"):
		return fmt.Errorf("%w %s: %w", errAbortCommitted, h.MsgID, err)
	}
	return err
}

// endOne ends one half message with retries. It returns errDiscardedHalf
// when the broker discarded it.
func (lc *laneCommitter) endOne(ctx context.Context, h *client.TxHandle, commit bool) error {
	return lc.endRetry(ctx, h, commit, lc.endAttempt(ctx, h, commit), nil)
}

// endAttempt sends one END_TRANSACTION for h and classifies its error.
func (lc *laneCommitter) endAttempt(ctx context.Context, h *client.TxHandle, commit bool) error {
	actx, cancel := attemptCtx(ctx, lc.timeout)
	defer cancel()
	return classifyEnd(lc.end.EndTransaction(actx, *h, commit), h, commit)
}

// endRetry retries ending h after a first attempt that ended with err
// (classified), with backoff, up to the configured attempts in all. It
// gives up at once on a refusal no retry can change, on a closed producer
// and when ctx ends. After a commit whose outcome is unknown (the request
// went out, its answer did not come: endUnsure) it asks v whether the
// broker committed h before it sends the commit again — Apache RocketMQ's
// broker stores a half message again for every commit — and asks again
// (within the same attempts) while v cannot tell. Without v (nil) it
// sends the commit again.
func (lc *laneCommitter) endRetry(ctx context.Context, h *client.TxHandle, commit bool, err error, v *endVerifier) error {
	failedAt := time.Now()
	unsure := commit && v != nil && endUnsure(err)
	for i := 1; i < lc.attempts && err != nil; i++ {
		if errors.Is(err, errDiscardedHalf) || errors.Is(err, ErrRolledBack) || errors.Is(err, errAbortCommitted) ||
			errors.Is(err, client.ErrClosed) || ctx.Err() != nil {
			return err
		}
		lc.log.Warn("rocketmq sink: END_TRANSACTION failed; retrying", "group", lc.group, "msgId", h.MsgID,
			"commit", commit, "attempt", i, "of", lc.attempts, "unsure", unsure, "err", err)
		if backoff.Sleep(ctx, lc.retry.Delay(i-1)) != nil {
			return err
		}
		if unsure {
			done, verr := v.committed(ctx, h, failedAt)
			switch {
			case verr != nil:
				err = verr
				continue // still unsure: ask again
			case done:
				return nil
			}
			unsure = false
		}
		err = lc.endAttempt(ctx, h, commit)
		failedAt = time.Now()
		unsure = commit && v != nil && endUnsure(err)
	}
	return err
}

// endUnsure reports whether an END_TRANSACTION that failed with err may
// have been applied: sent, and its answer lost (or the test fault that
// pretends so).
func endUnsure(err error) bool { return client.MaybeApplied(err) || errors.Is(err, errLostAnswer) }

// endAll ends every handle of hs (commit, or roll back), lanes in
// parallel, each lane in order (see the notes above endSender). When a
// commit finds a half message discarded by the broker, again (when not
// nil) sends its record again and commits it right there, before the
// lane's next handle, so that records of one key stay in order; without
// again endAll returns the indexes of discarded half messages (commit
// only). It returns the first error of a lane that failed for good, or
// ctx's error when ctx ended with lanes unfinished.
func (lc *laneCommitter) endAll(ctx context.Context, hs []txnHandle, commit bool, again againFunc) ([]int, error) {
	return lc.endAllTracked(ctx, hs, commit, again, nil, nil)
}

// endAllTracked is endAll that also marks in ended (nil, or one entry per
// handle of hs) every handle the broker acknowledged ending (or, for a
// discarded one, whose record again sent and committed), and that asks v
// (when not nil) whether a commit whose answer was lost was applied before
// sending it again (see endRetry).
func (lc *laneCommitter) endAllTracked(ctx context.Context, hs []txnHandle, commit bool, again againFunc, ended []bool, v *endVerifier) ([]int, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := newLaneRun(lc, hs, commit, again, cancel)
	r.ended, r.verify = ended, v
	// The pipelined requests are not cancelled with ctx (that would cost a
	// context.AfterFunc each): after a failure no new one is sent, and
	// those in flight end with their answer or the request timeout.
	rctx := context.WithoutCancel(ctx)
	for l := range uint32(len(r.next)) {
		if r.start[l] < r.start[l+1] {
			r.send(ctx, rctx, l)
		}
	}
	stopped := r.collect(ctx, rctx)
	r.handed.Wait()
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if stopped && r.st.firstErr == nil {
		// Lanes left unfinished by ctx's end, not by a failure.
		r.st.firstErr = fmt.Errorf("rocketmq sink: ending half messages: %w", ctx.Err())
	}
	return r.st.discarded, r.st.firstErr
}

// laneRun is one endAll: the handles by lane, each lane's progress, and
// the pipeline's answers. Its fields other than q and st belong to the
// goroutine running endAll.
type laneRun struct {
	lc     *laneCommitter
	hs     []txnHandle
	commit bool
	again  againFunc

	// Handles by lane, in order: lane l's are order[start[l]:start[l+1]];
	// next[l] is the position in order of its next handle to end.
	order []int32
	start []int32
	next  []int32

	q        endQueue
	st       endState
	ended    []bool               // nil, or per handle: acknowledged (each written by the goroutine ending its lane)
	verify   *endVerifier         // nil, or asked after commits whose answer was lost
	cbs      []func(error)        // per lane, its pipelined requests' callback
	cancels  []context.CancelFunc // per lane, its request's deadline (lc.timeout > 0)
	inflight int                  // pipelined requests unanswered
	handed   sync.WaitGroup       // lanes handed over to goroutines of their own
}

// newLaneRun sorts hs by lane (a counting sort, stable: each lane in write
// order). Lanes of a decoded description may exceed the configured count
// (it may have changed since).
func newLaneRun(lc *laneCommitter, hs []txnHandle, commit bool, again againFunc, cancel context.CancelFunc) *laneRun {
	nl := uint32(0)
	for i := range hs {
		nl = max(nl, hs[i].lane+1)
	}
	r := &laneRun{lc: lc, hs: hs, commit: commit, again: again,
		start: make([]int32, nl+1), next: make([]int32, nl), order: make([]int32, len(hs)),
		cbs: make([]func(error), nl)}
	for i := range hs {
		r.start[hs[i].lane+1]++
	}
	for l := uint32(1); l <= nl; l++ {
		r.start[l] += r.start[l-1]
	}
	copy(r.next, r.start[:nl])
	for i := range hs {
		l := hs[i].lane
		r.order[r.next[l]] = int32(i)
		r.next[l]++
	}
	copy(r.next, r.start[:nl])
	r.q.wake = make(chan struct{}, 1)
	r.st.cancel = cancel
	if lc.timeout > 0 {
		r.cancels = make([]context.CancelFunc, nl)
	}
	return r
}

// send sends lane l's next END_TRANSACTION on the pipeline (rctx: not
// cancelled with ctx), or, once an answer failed, hands the rest of the
// lane over.
func (r *laneRun) send(ctx, rctx context.Context, l uint32) {
	if r.q.failed.Load() {
		r.handOver(ctx, l, nil)
		return
	}
	if r.cbs[l] == nil {
		r.cbs[l] = func(err error) { r.q.put(l, err) }
	}
	actx := rctx
	if r.cancels != nil {
		actx, r.cancels[l] = context.WithTimeout(rctx, r.lc.timeout)
	}
	r.inflight++
	r.lc.end.EndTransactionAsync(actx, r.hs[r.order[r.next[l]]].h, r.commit, r.cbs[l])
}

// collect takes the pipeline's answers until none is in flight, sending
// each lane's next END_TRANSACTION once its previous one is answered and
// handing a lane whose answer failed over. It reports whether a lane was
// left unfinished because ctx ended.
func (r *laneRun) collect(ctx, rctx context.Context) (stopped bool) {
	var spare []endAnswer
	for r.inflight > 0 {
		answers := r.q.take(spare)
		for _, a := range answers {
			r.inflight--
			l := a.lane
			if r.cancels != nil {
				r.cancels[l]()
			}
			if a.err != nil {
				r.handOver(ctx, l, classifyEnd(a.err, &r.hs[r.order[r.next[l]]].h, r.commit))
				continue
			}
			if r.ended != nil {
				r.ended[r.order[r.next[l]]] = true
			}
			r.next[l]++
			if r.next[l] == r.start[l+1] {
				continue // the lane is done
			}
			if ctx.Err() != nil {
				stopped = true
				continue
			}
			r.send(ctx, rctx, l)
		}
		spare = answers
	}
	return stopped
}

// handOver ends the rest of lane l, from its next handle, on a goroutine of
// its own; failed is the (classified) error of the attempt already made at
// that handle (nil: none).
func (r *laneRun) handOver(ctx context.Context, l uint32, failed error) {
	rest := r.order[r.next[l]:r.start[l+1]]
	r.handed.Go(func() { r.endLane(ctx, rest, failed) })
}

// endLane ends the handles idx of one lane in order, synchronously with
// retries, the first of them after an attempt that failed with failed (nil:
// none was made).
func (r *laneRun) endLane(ctx context.Context, idx []int32, failed error) {
	for k, i := range idx {
		var err error
		h := &r.hs[i].h
		if k == 0 && failed != nil {
			err = r.lc.endRetry(ctx, h, r.commit, failed, r.verify)
		} else {
			err = r.lc.endRetry(ctx, h, r.commit, r.lc.endAttempt(ctx, h, r.commit), r.verify)
		}
		if errors.Is(err, errDiscardedHalf) && r.commit && r.again != nil {
			err = r.again(ctx, int(i))
		}
		if errors.Is(err, errDiscardedHalf) && r.commit {
			r.st.discard(int(i))
			continue
		}
		if err != nil {
			r.st.failed(err)
			return
		}
		if r.ended != nil {
			r.ended[i] = true
		}
	}
}

// endState is the outcome of an endAll, shared by its lanes.
type endState struct {
	cancel    context.CancelFunc
	mu        sync.Mutex
	firstErr  error
	discarded []int
}

// failed records a lane that failed for good and stops the others.
func (st *endState) failed(err error) {
	st.mu.Lock()
	if st.firstErr == nil {
		st.firstErr = err
	}
	st.mu.Unlock()
	st.cancel()
}

// discard records that the broker discarded hs[i] (no again).
func (st *endState) discard(i int) {
	st.mu.Lock()
	st.discarded = append(st.discarded, i)
	st.mu.Unlock()
}

// endAnswer is an answered END_TRANSACTION of endAll's pipeline.
type endAnswer struct {
	lane uint32
	err  error
}

// endQueue collects the answers of endAll's pipelined END_TRANSACTIONs
// (connection reader goroutines) for the goroutine driving it.
type endQueue struct {
	mu      sync.Mutex
	answers []endAnswer
	wake    chan struct{} // one token: answers is not empty
	failed  atomic.Bool   // an answer was an error
}

func (q *endQueue) put(lane uint32, err error) {
	if err != nil {
		q.failed.Store(true)
	}
	q.mu.Lock()
	q.answers = append(q.answers, endAnswer{lane: lane, err: err})
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take waits for answers and returns them, leaving spare (emptied) to
// collect the next ones.
func (q *endQueue) take(spare []endAnswer) []endAnswer {
	<-q.wake
	q.mu.Lock()
	defer q.mu.Unlock()
	answers := q.answers
	q.answers = spare[:0]
	return answers
}
