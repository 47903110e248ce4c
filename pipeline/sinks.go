package pipeline

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
)

// rec is a record on a channel to a sink.
type rec[T any] struct {
	v  T
	ts int64
	tr runtime.RecordTrace // nil when not traced (hooks.go)
}

// sinkPort is one task's output to a sink task.
type sinkPort[T any] struct {
	in     *inbox[rec[T]]
	sender int
	pool   *sync.Pool
	buf    *[]rec[T]
	meta   *recMeta // the sending task's current record (its trace)
}

func (p *sinkPort[T]) emit(ctx context.Context, v T, ts int64) error {
	if p.buf == nil {
		p.buf = getBatch[rec[T]](p.pool)
	}
	*p.buf = append(*p.buf, rec[T]{v: v, ts: ts, tr: p.meta.trace})
	if len(*p.buf) >= batchSize {
		return p.flush(ctx)
	}
	return nil
}

func (p *sinkPort[T]) flush(ctx context.Context) error {
	if p.buf == nil || len(*p.buf) == 0 {
		return nil
	}
	b := p.buf
	p.buf = nil
	return p.in.push(ctx, p.sender, message[rec[T]]{kind: msgData, batch: b})
}

func (p *sinkPort[T]) barrier(ctx context.Context, id uint64, stop bool) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	return p.in.push(ctx, p.sender, message[rec[T]]{kind: msgBarrier, id: id, stop: stop})
}

// watermark is not forwarded to sinks: they have no timers.
func (p *sinkPort[T]) watermark(context.Context, int64) error { return nil }

func (p *sinkPort[T]) end(ctx context.Context) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	return p.in.push(ctx, p.sender, message[rec[T]]{kind: msgEOS})
}

// sinkRetry is how often the runtime retries a failing sink call before it
// fails the job (Write, Flush, PreCommit) or gives up until the next
// notification (Commit).
var sinkRetry = retryPolicy{attempts: 3, backoff: backoff.Policy{Initial: 10 * time.Millisecond, Max: time.Second}}

func newSinkNode[T any](j *Job, uid string, sk sink.Sink[T], inputs ...*node) *node {
	n := j.addNode(uid, kindSink, inputs...)
	n.exchange = true
	n.sink = sk
	if sk == nil {
		j.errorf("sink %q is nil", uid)
	}
	n.binder = binderOf(sk)
	tpc, _ := sk.(sink.TwoPhaseCommit[T])
	pool := newBatchPool[rec[T]]()
	var in *inbox[rec[T]]
	n.setup = func(*jobRun) error {
		in = newInbox[rec[T]](n.senders, pool)
		return nil
	}
	n.addSender = func() { in.addSender() }
	n.buildInput = func(b *chainBuilder) (any, error) {
		s, err := b.sender(n)
		if err != nil {
			return nil, err
		}
		p := &sinkPort[T]{in: in, sender: s, pool: pool, meta: &b.meta}
		in.setBlocked(s, b.blockedCounter()) // hooks.go
		b.addPort(p)
		return emitFn[T](p.emit), nil
	}
	n.taskCount = func(_ context.Context, r *jobRun) (int, error) {
		if !r.inScope(n) {
			return 0, nil // another scale-out task's sink
		}
		return 1, nil
	}
	if tpc != nil {
		n.restore = func(ctx context.Context, r *jobRun) error {
			all, err := r.engine.Store().PendingCommits()
			if err != nil {
				return err
			}
			var mine []checkpoint.PendingCommit
			var data [][]byte
			for _, pc := range all {
				if pc.SinkUID == uid {
					mine = append(mine, pc)
					data = append(data, pc.Data)
				}
			}
			if err := checkRestore(ctx, r, uid, tpc, mine); err != nil { // savepoint.go
				return err
			}
			if err := tpc.Recover(ctx, data); err != nil {
				return fmt.Errorf("recover: %w", err)
			}
			for _, pc := range mine {
				if err := callErr(ctx, sinkRetry, tpc.Commit, ctx, pc.Data); err != nil {
					return fmt.Errorf("commit pending transaction of checkpoint %d: %w", pc.CheckpointID, err)
				}
			}
			r.engine.Resolved(mine...)
			return nil
		}
	}
	var async sink.AsyncCommitter
	if tpc != nil {
		async, _ = sk.(sink.AsyncCommitter)
	}
	n.startTask = func(r *jobRun, t *taskInfo) error {
		st := &sinkTask[T]{n: n, uid: uid, sk: sk, tpc: tpc, async: async, in: in, log: r.engine.Logger(), hooks: r.hooks,
			ops: sinkOperatorState(r.engine, uid, sk)}
		_, err := r.engine.AddTask(uid, runtime.SinkTask, st.run)
		return err
	}
	return n
}

type sinkTask[T any] struct {
	inputDefaults
	n     *node
	uid   string
	sk    sink.Sink[T]
	tpc   sink.TwoPhaseCommit[T]
	async sink.AsyncCommitter // tpc's, when it commits in the background
	in    *inbox[rec[T]]
	h     *runtime.Handle // set by run
	cnt   *counter        // set by run
	// pending are pre-committed transactions not started (or failed);
	// committing are those started (async) and not yet waited for. Both
	// stay listed in every checkpoint until h.Resolved.
	pending    []checkpoint.PendingCommit
	committing []startedCommit
	hooks      *runHooks           // hooks.go
	ops        *OperatorStateStore // the sink's operator state (opstate.go); nil when none
	log        interface {
		Warn(msg string, args ...any)
	}
}

// startedCommit is a transaction whose commit was started in the
// background (AsyncCommitter).
type startedCommit struct {
	pc    checkpoint.PendingCommit
	start time.Time
}

// snapshot implements checkpointed: the sink's flush or pre-commit, and its
// operator state.
func (st *sinkTask[T]) snapshot(ctx context.Context, id uint64) (runtime.Ack, error) {
	a, err := st.snapshotSink(ctx, id)
	if err == nil && st.ops != nil {
		a.Part, err = st.snapshotOpState(id) // opstate.go
	}
	return a, err
}

func (st *sinkTask[T]) snapshotSink(ctx context.Context, id uint64) (runtime.Ack, error) {
	if st.tpc == nil {
		flush := func(ctx context.Context, _ struct{}) error { return st.sk.Flush(ctx) }
		start := time.Now()
		err := callErr(ctx, sinkRetry, flush, ctx, struct{}{})
		st.hooks.onSinkCommit(st.uid, id, time.Since(start), err)
		if err != nil {
			return runtime.Ack{}, fmt.Errorf("sink %q: flush: %w", st.uid, err)
		}
		return runtime.Ack{}, nil
	}
	st.settle(ctx)
	txn, err := call(ctx, sinkRetry, st.tpc.PreCommit, ctx, id)
	if err != nil {
		return runtime.Ack{}, fmt.Errorf("sink %q: pre-commit %d: %w", st.uid, id, err)
	}
	pc := checkpoint.PendingCommit{SinkUID: st.uid, CheckpointID: id, Data: txn}
	st.pending = append(st.pending, pc)
	return runtime.Ack{Pending: []checkpoint.PendingCommit{pc}}, nil
}

// note implements checkpointed: it commits, after checkpoint n completed,
// every transaction pre-committed for a checkpoint up to n (failed
// checkpoints' transactions ride along with the next one). An
// AsyncCommitter's commits are only started: settle waits for them.
func (st *sinkTask[T]) note(ctx context.Context, n runtime.Note) error {
	if !n.Completed || st.tpc == nil {
		return nil
	}
	kept := st.pending[:0]
	for _, pc := range st.pending {
		if pc.CheckpointID > n.ID {
			kept = append(kept, pc)
			continue
		}
		start := time.Now()
		if st.async != nil {
			if err := callErr(ctx, sinkRetry, st.async.StartCommit, ctx, pc.Data); err != nil {
				st.hooks.onSinkCommit(st.uid, pc.CheckpointID, time.Since(start), err)
				st.log.Warn("sink commit failed to start; retried after the next checkpoint and on restore", "sink", st.uid, "checkpoint", pc.CheckpointID, "err", err)
				kept = append(kept, pc)
				continue
			}
			st.committing = append(st.committing, startedCommit{pc: pc, start: start})
			continue
		}
		err := callErr(ctx, sinkRetry, st.tpc.Commit, ctx, pc.Data)
		st.hooks.onSinkCommit(st.uid, pc.CheckpointID, time.Since(start), err)
		if err != nil {
			st.log.Warn("sink commit failed; retried after the next checkpoint and on restore", "sink", st.uid, "checkpoint", pc.CheckpointID, "err", err)
			kept = append(kept, pc)
			continue
		}
		st.h.Resolved(pc)
	}
	st.pending = kept
	return nil
}

// settle waits for the commits an AsyncCommitter started and records them
// as resolved (the next checkpoint no longer lists them) only once they
// are committed; after a failure they are pending again, retried after the
// next completed checkpoint and on restore.
func (st *sinkTask[T]) settle(ctx context.Context) {
	if len(st.committing) == 0 {
		return
	}
	err := st.async.WaitCommits(ctx)
	for _, c := range st.committing {
		st.hooks.onSinkCommit(st.uid, c.pc.CheckpointID, time.Since(c.start), err)
		if err == nil {
			st.h.Resolved(c.pc)
		} else {
			st.pending = append(st.pending, c.pc)
		}
	}
	if err != nil {
		st.log.Warn("sink commit failed; retried after the next checkpoint and on restore", "sink", st.uid, "transactions", len(st.committing), "err", err)
		slices.SortStableFunc(st.pending, func(a, b checkpoint.PendingCommit) int { return cmp.Compare(a.CheckpointID, b.CheckpointID) })
	}
	clear(st.committing)
	st.committing = st.committing[:0]
}

func (st *sinkTask[T]) run(ctx context.Context, h *runtime.Handle) (err error) {
	defer func() {
		if cerr := st.sk.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("sink %q: close: %w", st.uid, cerr)
		}
	}()
	defer recoverTask(&err)
	st.h = h
	if err := st.initOpState(); err != nil { // opstate.go
		return err
	}
	st.cnt = &counter{stats: st.n.stats}
	if err := newInputLoop(h, st.in, inputTask[rec[T]](st), nil, st.cnt.flush, false, 0, nil).run(ctx); err != nil {
		return err
	}
	st.settle(ctx)
	if len(st.pending) > 0 {
		return fmt.Errorf("sink %q: %d transactions could not be committed (they stay pending in the checkpoint)", st.uid, len(st.pending))
	}
	return nil
}

// process implements inputTask: it writes the batch's records.
func (st *sinkTask[T]) process(ctx context.Context, m message[rec[T]]) error {
	for i := range *m.batch {
		st.cnt.in++
		var err error
		if r := &(*m.batch)[i]; r.tr != nil {
			err = st.writeTraced(ctx, r) // hooks.go
		} else {
			err = callErr(ctx, sinkRetry, st.sk.Write, ctx, r.v)
		}
		if err != nil {
			return fmt.Errorf("sink %q: write: %w", st.uid, err)
		}
	}
	return nil
}

// watermark implements inputTask: a sink takes no watermarks.
func (st *sinkTask[T]) watermark(context.Context, int64) error { return nil }
