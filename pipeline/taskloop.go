package pipeline

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/runtime"
)

// Task loops. A task is one of two kinds, and each kind has one loop:
//
//   - A task fed by an inbox (a keyed subtask, a parallel stage's subtask,
//     a sink) runs an inputLoop. The loop pops its senders' messages,
//     aligns checkpoint barriers over the senders (aligner), combines their
//     watermarks (inputWatermarks), and hands the task what is its own:
//     the records of a batch, the rises of the watermark, the snapshot
//     for a checkpoint, its timers and background work (inputTask).
//   - A task that starts the stream (a source split's task, a scale-out
//     stage's repartition reader) polls in a loop of its own and takes the
//     checkpoints the coordinator triggers at it, between two polls.
//
// Both kinds share a taskCore: a checkpoint is taken the same way
// everywhere (taskCore.checkpoint: the output flushed and durable, the
// task's snapshot acknowledged, then the barrier sent on), and a task ends
// the same way (taskCore.end: the output ended, then finishedLoop answers
// checkpoints until the job closes). A keyed or stage subtask whose inputs
// all ended first waits for its background work (inputLoop.drain),
// taking triggered checkpoints as a source does.

// checkpointed is a task's part in checkpoints.
type checkpointed interface {
	// snapshot returns the task's acknowledgement of checkpoint id,
	// taken where the checkpoint's barrier passes the task.
	snapshot(ctx context.Context, id uint64) (runtime.Ack, error)
	// note handles the outcome of a checkpoint (completed or aborted).
	note(ctx context.Context, n runtime.Note) error
}

// taskCore is what every task loop shares: the task's handle, its output
// ports and counters, and its part in checkpoints.
type taskCore struct {
	h        *runtime.Handle
	ports    []port
	counters func() // publishes the task's counters
	cp       checkpointed
	notes    []runtime.Note
}

// recoverTask turns a panic of the task's goroutine into its error: defer
// it first in a task's run.
func recoverTask(err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("%w: %v", ErrPanic, p)
	}
}

// readNotes hands the checkpoint outcomes the coordinator sent to the
// task.
func (c *taskCore) readNotes(ctx context.Context) error {
	c.notes = c.h.Notes(c.notes[:0])
	for _, n := range c.notes {
		if err := c.cp.note(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// checkpoint takes checkpoint id where the task's output stands: it
// flushes the output and waits until it is durable (a repartition topic's
// sends), acknowledges the task's snapshot, then sends the barrier
// downstream. The inputLoop calls it when a barrier is aligned; a task
// that starts the stream, when the coordinator triggers one.
func (c *taskCore) checkpoint(ctx context.Context, id uint64, stop bool) error {
	if err := flushPorts(ctx, c.ports); err != nil {
		return err
	}
	if err := syncPorts(ctx, c.ports); err != nil {
		return err
	}
	c.counters()
	a, err := c.cp.snapshot(ctx, id)
	if err != nil {
		return err
	}
	c.h.Ack(id, a)
	return barrierPorts(ctx, c.ports, id, stop)
}

// takeTriggered takes the checkpoint the coordinator triggered at the task,
// if one is waiting (ok); stop reports a stop checkpoint, after which the
// task must emit nothing more and finish.
func (c *taskCore) takeTriggered(ctx context.Context) (ok, stop bool, err error) {
	id, stop, ok := c.h.Trigger()
	if !ok {
		return false, false, nil
	}
	return true, stop, c.checkpoint(ctx, id, stop)
}

// beforePoll is what a task that starts the stream does before each poll:
// it hands the task its notes and takes the checkpoints triggered at it.
// done reports that the task must return err: it failed, its context
// ended, or it took a stop checkpoint and finished (finishedLoop ran).
func (c *taskCore) beforePoll(ctx context.Context) (done bool, err error) {
	for {
		if err := c.readNotes(ctx); err != nil {
			return true, err
		}
		ok, stop, err := c.takeTriggered(ctx)
		switch {
		case err != nil:
			return true, err
		case stop:
			return true, c.finish(ctx)
		case !ok:
			return ctx.Err() != nil, ctx.Err()
		}
	}
}

// idle publishes the task's counters and flushes its partial output
// batches: the task is about to wait.
func (c *taskCore) idle(ctx context.Context) error {
	c.counters()
	return flushPorts(ctx, c.ports)
}

// end ends the task's output, then waits in finishedLoop until the job
// closes.
func (c *taskCore) end(ctx context.Context) error {
	if err := c.idle(ctx); err != nil {
		return err
	}
	if err := endPorts(ctx, c.ports); err != nil {
		return err
	}
	return c.finish(ctx)
}

// finish waits in finishedLoop until the job closes.
func (c *taskCore) finish(ctx context.Context) error { return finishedLoop(ctx, c.h, c.cp) }

// inputTask is what an inputLoop drives: a task's own part. The loop calls
// it from the task's goroutine only. Embed inputDefaults for the methods a
// task without timers, background work or event time does not need.
type inputTask[R any] interface {
	checkpointed
	// process handles the records of a data message (the loop returns
	// the batch to its pool afterwards).
	process(ctx context.Context, m message[R]) error
	// advanced is called when the combined input watermark rose to wm,
	// before wm is passed on (a keyed subtask fires its event timers);
	// wm is math.MaxInt64 once every input ended.
	advanced(ctx context.Context, wm int64) error
	// watermark passes a watermark, or the idleWatermark and
	// activeNoWatermark markers, on to the task's outputs, in order with
	// its output.
	watermark(ctx context.Context, wm int64) error
	// wakeups runs what is due (processing timers) and returns the
	// task's own wake-up channels for its next wait, nil when none:
	// events signals background work done, timer a timer.
	wakeups(ctx context.Context) (events <-chan struct{}, timer <-chan time.Time, err error)
	// wakeup handles a wake-up: timer fired, or events did.
	wakeup(ctx context.Context, timer bool) error
	// outstanding reports background work (async requests in
	// flight): after every input ended, the loop serves checkpoints and
	// wake-ups until there is none, then ends the task's output.
	outstanding() bool
	// stopped is called after a stop checkpoint passed: emit nothing
	// more.
	stopped()
}

// inputDefaults implements the inputTask methods of a task without timers,
// background work or event time.
type inputDefaults struct{}

func (inputDefaults) advanced(context.Context, int64) error { return nil }
func (inputDefaults) wakeups(context.Context) (<-chan struct{}, <-chan time.Time, error) {
	return nil, nil, nil
}
func (inputDefaults) wakeup(context.Context, bool) error { return nil }
func (inputDefaults) outstanding() bool                  { return false }
func (inputDefaults) stopped()                           {}

// inputLoop is the loop of a task fed by an inbox.
type inputLoop[R any] struct {
	taskCore
	in  *inbox[R]
	t   inputTask[R]
	al  *aligner
	wms *inputWatermarks // nil: the task takes no watermarks (a sink)
	wm  int64            // the combined input watermark, as passed on
	// gauge, when set, shows wm on the status endpoint.
	gauge   *atomic.Int64
	senders int
}

// newInputLoop returns the loop of task t fed by in, with output ports and
// counters (published by flushCounters). A task that takes watermarks
// starts at watermark wm (a restored one, or math.MinInt64), shown on
// gauge when not nil; a sink passes watermarks false.
func newInputLoop[R any](h *runtime.Handle, in *inbox[R], t inputTask[R], ports []port, flushCounters func(),
	watermarks bool, wm int64, gauge *atomic.Int64) *inputLoop[R] {
	senders := in.senderCount() // discovery may add senders (discovery.go)
	l := &inputLoop[R]{
		taskCore: taskCore{h: h, ports: ports, counters: flushCounters, cp: t},
		in:       in, t: t, al: newAligner(senders), wm: wm, gauge: gauge, senders: senders,
	}
	if watermarks {
		l.wms = newInputWatermarks(senders, wm)
	}
	return l
}

// run runs the loop until the job closes (nil) or the task fails.
func (l *inputLoop[R]) run(ctx context.Context) error {
	idle := func() error { return l.idle(ctx) }
	for {
		events, timer, err := l.t.wakeups(ctx)
		if err != nil {
			return err
		}
		s, m, res, err := l.in.pop(ctx, l.h.Wake(), events, timer, idle)
		switch res {
		case popWake:
			if err := l.readNotes(ctx); err != nil {
				return err
			}
			continue
		case popEvent, popTimer:
			if err := l.t.wakeup(ctx, res == popTimer); err != nil {
				return err
			}
			continue
		case popDone:
			return err
		}
		if m.kind != msgData {
			l.grow()
		}
		switch m.kind {
		case msgData:
			if err := l.t.process(ctx, m); err != nil {
				return err
			}
			l.in.recycle(m)
		case msgWatermark:
			if l.wms != nil && l.wms.update(s, m.wm) {
				if err := l.advance(ctx); err != nil {
					return err
				}
			}
		case msgBarrier:
			if l.al.barrier(s, m.id, m.stop, l.in.block, l.in.unblock) {
				if finished, err := l.aligned(ctx); finished || err != nil {
					return err
				}
			}
		case msgEOS:
			if l.al.end(s) {
				if finished, err := l.aligned(ctx); finished || err != nil {
					return err
				}
			}
			// Once every input ended, the watermark rises to the end of
			// time: every event timer fires.
			if err := l.advance(ctx); err != nil {
				return err
			}
			if l.al.allEnded() {
				return l.drain(ctx)
			}
		}
	}
}

// grow aligns (and holds the watermark back for) a sender that discovery
// added, even before it sends anything.
func (l *inputLoop[R]) grow() {
	n := l.in.senderCount()
	if n <= l.senders {
		return
	}
	l.senders = n
	l.al.grow(n)
	if l.wms != nil {
		l.wms.grow(n)
	}
}

// aligned takes the checkpoint whose barrier every live sender delivered,
// and reads the senders on. After a stop checkpoint the task is finished
// (finishedLoop ran): finished is true and err is its result.
func (l *inputLoop[R]) aligned(ctx context.Context) (finished bool, err error) {
	id, stop := l.al.done, l.al.maxStop
	if err := l.checkpoint(ctx, id, stop); err != nil {
		return true, err
	}
	l.in.unblockAll()
	if !stop {
		return false, nil
	}
	l.t.stopped()
	return true, l.finish(ctx)
}

// advance passes the combined input watermark on when it rose, and
// idleness when every live sender is idle (and activity when one is not
// any more).
func (l *inputLoop[R]) advance(ctx context.Context) error {
	if l.wms == nil {
		return nil
	}
	wm, idle := l.wms.combined(l.al.eos)
	if !idle && l.wms.outIdle {
		l.wms.outIdle = false
		if err := l.t.watermark(ctx, max(l.wm, activeNoWatermark)); err != nil {
			return err
		}
	}
	if wm > l.wm {
		l.wm = wm
		if l.gauge != nil {
			l.gauge.Store(wm)
		}
		if err := l.t.advanced(ctx, wm); err != nil {
			return err
		}
		if wm == math.MaxInt64 {
			return nil // the end of input: passed on as EOS
		}
		if err := l.t.watermark(ctx, wm); err != nil {
			return err
		}
		l.wms.outIdle = false
	}
	if idle && !l.wms.outIdle {
		l.wms.outIdle = true
		return l.t.watermark(ctx, idleWatermark)
	}
	return nil
}

// drain runs once every input ended: while the task has background work
// outstanding, checkpoints reach it by trigger only (no input brings
// barriers any more), and it takes them as a source does; then it ends its
// output.
func (l *inputLoop[R]) drain(ctx context.Context) error {
	for l.t.outstanding() {
		if ok, stop, err := l.takeTriggered(ctx); ok {
			if err != nil {
				return err
			}
			if stop {
				l.t.stopped()
				return l.finish(ctx)
			}
			continue
		}
		if err := l.idle(ctx); err != nil { // pass the results on before waiting
			return err
		}
		events, timer, err := l.t.wakeups(ctx)
		if err != nil {
			return err
		}
		select {
		case <-l.h.Wake():
			err = l.readNotes(ctx)
		case <-events:
			err = l.t.wakeup(ctx, false)
		case <-timer:
			err = l.t.wakeup(ctx, true)
		case <-ctx.Done():
			return ctx.Err()
		}
		if err != nil {
			return err
		}
	}
	return l.end(ctx)
}
