package runtime

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// coordinator is the checkpoint coordinator: Run's loop, on Run's
// goroutine. Each turn it looks at the engine's state (task failures, the
// checkpoint in flight and its acknowledgements, finished tasks) and acts
// on it (commits a complete checkpoint, runs discovery, triggers the next
// checkpoint), or else waits for what changes it: the interval ticker, the
// in-flight checkpoint's timeout, the minimum pause, a discovery tick, a
// savepoint request, the user's cancellation, or a task's wake-up.
type coordinator struct {
	e     *Engine
	tasks []*Handle
	start func(*Handle) // starts a task added by discovery

	timeout   *time.Timer // the in-flight checkpoint's
	timeoutC  <-chan time.Time
	pause     *time.Timer // armed while a requested checkpoint waits for MinPause
	pauseC    <-chan time.Time
	lastEnd   time.Time // when the last checkpoint ended
	failures  int       // consecutive checkpoint failures
	stopping  bool      // the job stops with a stop checkpoint
	wantFinal bool      // every task finished: a final checkpoint ends the job
	// discPending: a discovery round is due (run between checkpoints).
	discPending bool
	userDone    <-chan struct{} // the user's ctx; nil once seen
	spQueue     []*spRequest    // savepoint requests waiting for a checkpoint
}

// run is the coordinator loop. It returns nil when the job ended cleanly
// (final or stop checkpoint committed), else the fatal error. Tasks added
// by discovery are appended to c.tasks and started with c.start.
func (c *coordinator) run(ctx context.Context) error {
	e := c.e
	var tick <-chan time.Time
	if e.cfg.Interval > 0 {
		t := time.NewTicker(e.cfg.Interval)
		defer t.Stop()
		tick = t.C
	}
	var discTick <-chan time.Time
	if e.discover != nil && e.cfg.DiscoveryInterval > 0 {
		t := time.NewTicker(e.cfg.DiscoveryInterval)
		defer t.Stop()
		discTick = t.C
	}
	defer func() {
		if c.timeout != nil {
			c.timeout.Stop()
		}
		if c.pause != nil {
			c.pause.Stop()
		}
	}()
	defer func() {
		e.mu.Lock()
		cp := e.mu.inflight
		e.mu.Unlock()
		if cp != nil {
			c.spQueue = append(c.spQueue, cp.sps...)
		}
		replySavepoints(c.spQueue, SavepointResult{}, ErrNotRunning)
	}()
	for {
		e.mu.Lock()
		errs := e.mu.errs
		cp := e.mu.inflight
		complete := cp != nil && len(cp.acks) == len(c.tasks)
		allFinished := e.mu.finished == len(c.tasks)
		e.mu.Unlock()
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		if complete {
			err := e.commit(cp)
			e.afterCommit(cp, err) // savepoint.go: savepoint files, retained copies
			e.mu.Lock()
			e.mu.inflight = nil
			e.mu.Unlock()
			if errors.Is(err, ErrPublish) {
				return err // nothing of the checkpoint may be committed
			}
			done, fatal := c.endCheckpoint(cp, err)
			if fatal != nil {
				return fatal
			}
			if done {
				return nil
			}
			continue
		}
		if cp == nil && c.discPending {
			c.discPending = false
			e.mu.Lock()
			anyFinished := e.mu.finished > 0
			e.mu.Unlock()
			if !c.stopping && !c.wantFinal && !anyFinished && e.discover != nil {
				if err := c.discover(ctx); err != nil {
					return err
				}
				continue
			}
		}
		if cp == nil && len(c.spQueue) > 0 && !c.stopping && !allFinished && !c.wantFinal {
			stop := false
			for _, r := range c.spQueue {
				stop = stop || r.stop
			}
			if stop {
				c.stopping = true
				e.log.Info("stopping with a savepoint", "job", e.cfg.Name)
			} else {
				c.trigger(false, false)
				continue
			}
		}
		if cp == nil {
			switch {
			case c.stopping:
				c.trigger(true, false)
				continue
			case allFinished || c.wantFinal:
				c.wantFinal = true
				c.trigger(false, true)
				continue
			case e.wanted.Load() && c.pauseC == nil:
				// A task's write-back buffer is full: checkpoint now
				// (its changes reach the store only through a checkpoint
				// batch), after the minimum pause.
				if wait := e.cfg.MinPause - time.Since(c.lastEnd); wait > 0 {
					c.pause = time.NewTimer(wait)
					c.pauseC = c.pause.C
					break
				}
				e.log.Debug("checkpoint requested by a task", "job", e.cfg.Name)
				c.trigger(false, false)
				continue
			}
		}
		select {
		case <-c.userDone:
			c.userDone = nil
			c.stopping = true
			e.log.Info("stopping: taking a final checkpoint", "job", e.cfg.Name)
		case <-tick:
			if cp == nil && !c.stopping && !allFinished && time.Since(c.lastEnd) >= e.cfg.MinPause {
				c.trigger(false, false)
			}
		case <-c.timeoutC:
			c.timeout, c.timeoutC = nil, nil
			e.mu.Lock()
			e.abortLocked(cp)
			e.mu.inflight = nil
			e.mu.Unlock()
			replySavepoints(cp.sps, SavepointResult{}, fmt.Errorf("runtime: savepoint: checkpoint %d timed out", cp.id))
			if _, fatal := c.endCheckpoint(cp, fmt.Errorf("runtime: checkpoint %d timed out after %v (%d of %d tasks acknowledged)", cp.id, e.cfg.Timeout, len(cp.acks), len(c.tasks))); fatal != nil {
				return fatal
			}
		case <-c.pauseC:
			c.pause, c.pauseC = nil, nil
		case <-discTick:
			c.discPending = true
		case <-e.discNow:
			c.discPending = true
		case r := <-e.sp.req:
			if e.cfg.Dir == "" {
				replySavepoints([]*spRequest{r}, SavepointResult{}, ErrNoCheckpointDir)
				break
			}
			c.spQueue = append(c.spQueue, r)
		case <-e.wake:
		}
	}
}

// discover runs the discovery callback, then starts the tasks it added.
func (c *coordinator) discover(ctx context.Context) error {
	e := c.e
	e.mu.Lock()
	e.mu.adding = true
	e.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	err := e.discover(dctx)
	cancel()
	e.mu.Lock()
	e.mu.adding = false
	added := e.mu.added
	e.mu.added = nil
	e.mu.Unlock()
	for _, h := range added {
		c.tasks = append(c.tasks, h)
		c.start(h)
	}
	if len(added) > 0 {
		e.log.Info("discovery added tasks", "job", e.cfg.Name, "tasks", len(added))
	}
	if err != nil {
		return fmt.Errorf("runtime: discovery: %w", err)
	}
	return nil
}

// trigger starts the next checkpoint (a stop or final one when asked),
// serving the savepoint requests queued.
func (c *coordinator) trigger(stop, final bool) {
	e := c.e
	e.wanted.Store(false) // this checkpoint serves pending requests
	id := e.ids.Add(1)
	e.mu.Lock()
	e.mu.inflight = &inflight{id: id, stop: stop, final: final, started: time.Now(), acks: make(map[int]Ack, len(c.tasks)), sps: c.spQueue}
	e.mu.Unlock()
	c.spQueue = nil
	e.log.Debug("checkpoint triggered", "job", e.cfg.Name, "checkpoint", id, "stop", stop, "final", final)
	e.checkpointBegin(e.mu.inflight) // hooks.go; only this goroutine sets inflight
	for _, h := range c.tasks {
		h.trigger(id, stop)
	}
	c.timeout = time.NewTimer(e.cfg.Timeout)
	c.timeoutC = c.timeout.C
}

// endCheckpoint ends checkpoint cp (failed when err is set): it notes the
// outcome to every task and reports whether the job is done (a stop or
// final checkpoint completed), or fatal when failures exceed the
// tolerance.
func (c *coordinator) endCheckpoint(cp *inflight, err error) (done bool, fatal error) {
	e := c.e
	if c.timeout != nil {
		c.timeout.Stop()
		c.timeout, c.timeoutC = nil, nil
	}
	c.lastEnd = time.Now()
	e.checkpointEnd(cp, err) // hooks.go
	if err == nil {
		c.failures = 0
		for _, h := range c.tasks {
			h.note(Note{ID: cp.id, Completed: true})
		}
		return cp.stop || cp.final, nil
	}
	c.failures++
	e.log.Warn("checkpoint failed", "job", e.cfg.Name, "checkpoint", cp.id, "err", err, "consecutive", c.failures)
	for _, h := range c.tasks {
		h.note(Note{ID: cp.id})
	}
	if c.failures > e.cfg.TolerableFailures {
		return false, fmt.Errorf("%w: %d consecutive failures, last: %w", ErrCheckpointFailed, c.failures, err)
	}
	return false, nil
}
