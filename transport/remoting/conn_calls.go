// The call table of a Conn: registering a request's pending call, the
// deadline sweep, completing a call with its response or error, and the
// Invoke family that sends requests and awaits them.

package remoting

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// complete delivers the outcome of cl, which the caller removed from the
// pending table (so it is the only one doing so).
func (c *Conn) complete(cl *call, stop func() bool, resp *protocol.Command, err error) {
	if cl.cb == nil {
		cl.ch <- result{resp, err}
		return
	}
	if stop != nil {
		stop()
	}
	<-c.asyncSem
	cl.cb(resp, err)
}

// register assigns req a fresh opaque and records cl as pending under it.
func (c *Conn) register(req *protocol.Command, cl *call) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.pending == nil {
		return c.mu.err
	}
	op := c.opaque.Add(1)
	for {
		if _, dup := c.mu.pending[op]; !dup {
			break
		}
		op = c.opaque.Add(1) // wrapped around onto a call still pending
	}
	req.Opaque, cl.opaque = op, op
	c.mu.pending[op] = cl
	c.inflight.Add(1)
	if !cl.deadline.IsZero() {
		c.mu.timed++
		c.armSweepLocked(cl.deadline)
	}
	return nil
}

// sweepSlack is how late the sweep may fail a timed-out call: deadlines
// within it of the armed time share one timer firing instead of re-arming.
const sweepSlack = 5 * time.Millisecond

// armSweepLocked makes sure the sweep fires by deadline (+ slack).
// Requires c.mu.
func (c *Conn) armSweepLocked(deadline time.Time) {
	if c.mu.sweep == nil {
		c.mu.sweepAt = deadline.Add(sweepSlack)
		c.mu.sweep = time.AfterFunc(time.Until(c.mu.sweepAt), c.sweepExpired)
		return
	}
	if !c.mu.sweepAt.IsZero() && !deadline.After(c.mu.sweepAt) && c.mu.sweepAt.Sub(deadline) <= sweepSlack {
		return // the armed firing covers it
	}
	if !c.mu.sweepAt.IsZero() && c.mu.sweepAt.Before(deadline) {
		return // fires earlier and re-arms for what is left
	}
	c.mu.sweepAt = deadline.Add(sweepSlack)
	c.mu.sweep.Reset(time.Until(c.mu.sweepAt))
}

// sweepExpired runs on the sweep timer's goroutine: it fails every
// InvokeAsyncTimeout call past its deadline with ErrTimeout and re-arms for
// the earliest remaining one. It scans the pending table, at most once per
// firing; firings are spaced by the deadlines themselves (plus slack).
func (c *Conn) sweepExpired() {
	now := time.Now()
	type expired struct {
		cl   *call
		stop func() bool
	}
	var out []expired
	c.mu.Lock()
	if c.mu.pending == nil {
		c.mu.Unlock()
		return // closed: shutdown failed every call
	}
	c.mu.sweepAt = time.Time{}
	var next time.Time
	if c.mu.timed > 0 {
		for op, cl := range c.mu.pending {
			if cl.deadline.IsZero() {
				continue
			}
			if !cl.deadline.After(now) {
				delete(c.mu.pending, op)
				c.inflight.Add(-1)
				c.mu.timed--
				out = append(out, expired{cl, cl.stop})
				continue
			}
			if next.IsZero() || cl.deadline.Before(next) {
				next = cl.deadline
			}
		}
	}
	if !next.IsZero() {
		c.mu.sweepAt = next.Add(sweepSlack)
		c.mu.sweep.Reset(time.Until(c.mu.sweepAt))
	}
	c.mu.Unlock()
	for _, e := range out {
		c.complete(e.cl, e.stop, nil, fmt.Errorf("remoting: request opaque %d: %w", e.cl.opaque, ErrTimeout))
	}
}

// take removes cl from the pending table if it is still there, returning
// its stop func. Whoever takes a call completes it.
func (c *Conn) take(cl *call) (stop func() bool, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.pending == nil || c.mu.pending[cl.opaque] != cl {
		return nil, false
	}
	delete(c.mu.pending, cl.opaque)
	c.inflight.Add(-1)
	if !cl.deadline.IsZero() {
		c.mu.timed--
	}
	return cl.stop, true
}

// ctxErr maps a done ctx to the error a call returns: ErrTimeout for a
// deadline, ctx's error (or cause) otherwise.
func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout
	}
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return ctx.Err()
}

func callErr(req *protocol.Command, err error) error {
	return fmt.Errorf("remoting: request code %d opaque %d: %w", req.Code, req.Opaque, err)
}

// Invoke sends req and waits for its response, or for ctx to end. It sets
// req's opaque (from this Conn's own counter), clears its response bit and
// fills in Language and Version when zero; req must not be used by another
// call until Invoke returns, and may be reused afterwards.
//
// Invoke blocks while the write queue is full (backpressure) and until the
// response arrives. When ctx ends first it returns an error wrapping
// ErrTimeout (deadline) or ctx's error, and forgets the call: a late
// response is dropped and counted. If the connection closes first the error
// wraps ErrConnClosed. The response is owned by the caller.
func (c *Conn) Invoke(ctx context.Context, req *protocol.Command) (*protocol.Command, error) {
	return c.invoke(ctx, req, time.Time{})
}

// InvokeTimeout is Invoke with a timeout the Conn enforces itself: when no
// response arrived within timeout of the call, it returns an error wrapping
// ErrTimeout. As InvokeAsyncTimeout, it spares the per-call
// context.WithTimeout and its timer: the Conn's one sweep timer serves every
// such call, and fires up to a few milliseconds after a deadline. ctx still
// bounds the call (whichever ends first wins); timeout <= 0 means none.
func (c *Conn) InvokeTimeout(ctx context.Context, req *protocol.Command, timeout time.Duration) (*protocol.Command, error) {
	var dl time.Time
	if timeout > 0 {
		dl = time.Now().Add(timeout)
	}
	return c.invoke(ctx, req, dl)
}

func (c *Conn) invoke(ctx context.Context, req *protocol.Command, deadline time.Time) (*protocol.Command, error) {
	if ctx.Err() != nil {
		return nil, callErr(req, ctxErr(ctx))
	}
	req.Flag &^= protocol.FlagResponse | protocol.FlagOneway
	c.stamp(req)
	cl := c.calls.Get().(*call)
	cl.deadline = deadline
	if err := c.register(req, cl); err != nil {
		c.calls.Put(cl)
		return nil, callErr(req, err)
	}
	bp, err := c.encode(req)
	if err == nil {
		err = c.enqueue(ctx, outFrame{buf: bp})
	}
	// The read side is taken once the request is out, not while it waits
	// for queue room: the reader goroutine may be needed meanwhile.
	if err == nil {
		if gen, ok := c.takeRead(cl); ok {
			return c.readOwn(ctx, req, cl, gen)
		}
	}
	if err != nil {
		if _, ok := c.take(cl); ok {
			c.calls.Put(cl)
			return nil, callErr(req, err)
		}
		// Close took the call first and is delivering its error.
		r := <-cl.ch
		c.calls.Put(cl)
		return r.resp, callErr(req, r.err)
	}
	return c.await(ctx, req, cl)
}

// await waits for the outcome of the sync call cl, registered and sent,
// or for ctx to end, and recycles cl.
func (c *Conn) await(ctx context.Context, req *protocol.Command, cl *call) (*protocol.Command, error) {
	select {
	case r := <-cl.ch:
		c.calls.Put(cl)
		if r.err != nil {
			return nil, callErr(req, r.err)
		}
		return r.resp, nil
	case <-ctx.Done():
		if _, ok := c.take(cl); ok {
			c.calls.Put(cl)
			return nil, callErr(req, ctxErr(ctx))
		}
		// The response (or the close) won the race; take what it delivers.
		r := <-cl.ch
		c.calls.Put(cl)
		if r.err != nil {
			return nil, callErr(req, r.err)
		}
		return r.resp, nil
	}
}

// InvokeAsync sends req and calls cb with its response or error, exactly
// once. req is treated as by Invoke and may be reused once InvokeAsync
// returns. At most WithMaxInFlightAsync calls await their response at once;
// InvokeAsync blocks for a slot and for room in the write queue, bounded by
// ctx. ctx also bounds the wait for the response: when it ends first, cb
// gets an error wrapping ErrTimeout (deadline) or ctx's error. A ctx that
// never ends waits until the response arrives or the Conn closes.
//
// Where cb runs: on the caller's goroutine, before InvokeAsync returns, when
// the request could not be sent (ctx ended while waiting, Conn closed,
// encoding error); on the Conn's reader goroutine when the response arrives
// (a sync caller reading its own response, see WithCallerReads, leaves such
// a response to the reader) (so cb must not block: hand long work to
// another goroutine, and never call Close from it); on a goroutine of context.AfterFunc when ctx ends first;
// on the goroutine that closes the Conn otherwise. cb owns the response.
func (c *Conn) InvokeAsync(ctx context.Context, req *protocol.Command, cb func(resp *protocol.Command, err error)) {
	c.invokeAsync(ctx, req, time.Time{}, cb)
}

// InvokeAsyncTimeout is InvokeAsync with a timeout the Conn enforces
// itself: when no response arrived within timeout of the call, cb gets an
// error wrapping ErrTimeout (on the goroutine of the Conn's sweep timer).
// It spares the per-call context.WithTimeout, timer and AfterFunc a
// deadline on ctx costs: one timer per Conn serves every such call, and
// fires up to a few milliseconds after a deadline. ctx still bounds the
// call as for InvokeAsync (whichever ends first wins); timeout <= 0 means
// none.
func (c *Conn) InvokeAsyncTimeout(ctx context.Context, req *protocol.Command, timeout time.Duration, cb func(resp *protocol.Command, err error)) {
	var dl time.Time
	if timeout > 0 {
		dl = time.Now().Add(timeout)
	}
	c.invokeAsync(ctx, req, dl, cb)
}

func (c *Conn) invokeAsync(ctx context.Context, req *protocol.Command, deadline time.Time, cb func(resp *protocol.Command, err error)) {
	if ctx.Err() != nil {
		cb(nil, callErr(req, ctxErr(ctx)))
		return
	}
	if err := c.acquire(ctx, c.asyncSem); err != nil {
		cb(nil, callErr(req, err))
		return
	}
	req.Flag &^= protocol.FlagResponse | protocol.FlagOneway
	c.stamp(req)
	cl := &call{cb: cb, deadline: deadline}
	if err := c.register(req, cl); err != nil {
		<-c.asyncSem
		cb(nil, callErr(req, err))
		return
	}
	c.needReader()
	code, opaque := req.Code, req.Opaque
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			if stop, ok := c.take(cl); ok {
				c.complete(cl, stop, nil, fmt.Errorf("remoting: request code %d opaque %d: %w", code, opaque, ctxErr(ctx)))
			}
		})
		c.mu.Lock()
		if c.mu.pending != nil && c.mu.pending[cl.opaque] == cl {
			cl.stop = stop
			c.mu.Unlock()
		} else {
			c.mu.Unlock()
			stop() // already completed (closed, or timed out at once)
		}
	}
	bp, err := c.encode(req)
	if err == nil {
		err = c.enqueue(ctx, outFrame{buf: bp})
	}
	if err != nil {
		if stop, ok := c.take(cl); ok {
			c.complete(cl, stop, nil, callErr(req, err))
		}
	}
}

// InvokeOneway sends req with the oneway bit set and no pending entry: the
// peer must not answer (a response would be dropped and counted). It sets
// req's opaque, flag, and Language/Version when zero; req may be reused once
// InvokeOneway returns. It returns once the frame is queued, blocking for a
// oneway slot (WithMaxInFlightOneway frames queued but unwritten) and queue
// room as ctx allows. A nil error does not mean the peer received it.
func (c *Conn) InvokeOneway(ctx context.Context, req *protocol.Command) error {
	if ctx.Err() != nil {
		return callErr(req, ctxErr(ctx))
	}
	if err := c.acquire(ctx, c.onewaySem); err != nil {
		return callErr(req, err)
	}
	req.Flag &^= protocol.FlagResponse
	req.MarkOneway()
	c.stamp(req)
	req.Opaque = c.opaque.Add(1)
	bp, err := c.encode(req)
	if err == nil {
		err = c.enqueue(ctx, outFrame{buf: bp, oneway: true})
	}
	if err != nil {
		<-c.onewaySem
		return callErr(req, err)
	}
	return nil
}

// deliver completes the pending call resp answers, or drops resp. It
// reports whether it completed a sync call.
func (c *Conn) deliver(resp *protocol.Command) bool {
	c.mu.Lock()
	cl, ok := c.mu.pending[resp.Opaque]
	var stop func() bool
	if ok {
		delete(c.mu.pending, resp.Opaque)
		c.inflight.Add(-1)
		stop = cl.stop
		if !cl.deadline.IsZero() {
			c.mu.timed--
		}
	}
	c.mu.Unlock()
	if !ok {
		c.dropped.Add(1)
		c.log.Debug("remoting: dropped response with unknown opaque", "opaque", resp.Opaque, "code", resp.Code)
		return false
	}
	sync := cl.cb == nil
	c.complete(cl, stop, resp, nil)
	return sync
}
