package remoting

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Who reads a client Conn.
//
// The reader goroutine reads the socket and completes each call whose
// response it reads. For a sync call (Invoke) that means a hand-off: the
// reader readies the waiting caller, and readying a goroutine makes the Go
// scheduler wake an idle OS thread to look for more work (runtime.wakep:
// a futex wake, a thread that spins and sleeps again). With one call in
// flight that hand-off is a fixed cost of every round trip: on a 2-core VM,
// a loopback echo takes about 22 µs through a reader goroutine and 13.5 µs
// when the caller reads its own response.
//
// So the read side has one holder at a time (rd.holder):
//
//   - rdLoop: the reader goroutine (always, on a Server's connections, and
//     on a client Conn over TLS or with WithCallerReads(false)).
//   - rdCaller: a sync caller that found the read side unheld when it
//     registered. It writes its request, reads frames until its response
//     arrives, completing other calls and serving requests it reads on the
//     way as the reader would, and leaves the read side unheld again, or
//     hands it to the reader goroutine when other calls are in flight or
//     bytes are buffered (they are the reader's to handle).
//   - rdNone: nobody. The reader goroutine leaves the read side unheld
//     after it completed a sync call with nothing else in flight, and
//     waits: an async call (needReader) or a caller handing back wakes it,
//     and it takes the read side back on its own after readerGrace, so
//     that a request from the peer, the peer's close or the idle timeout
//     wait at most readerGrace to be read while no call runs.
//
// The holder changes under rd's mutex; the read side's state (rbr, stash,
// midFrame, ...) moves with it.
const (
	rdLoop int32 = iota
	rdCaller
	rdNone
)

// readerGrace is how long the read side may stay unheld before the reader
// goroutine takes it back (see above).
const readerGrace = time.Millisecond

// takeRead gives the read side to the sync call cl if nobody holds it, and
// returns the caller's generation (for interruptRead).
func (c *Conn) takeRead(cl *call) (gen uint64, ok bool) {
	if !c.callerReads || c.rd.holder.Load() != rdNone {
		return 0, false
	}
	c.rd.Lock()
	defer c.rd.Unlock()
	if c.rd.holder.Load() != rdNone {
		return 0, false
	}
	c.rd.holder.Store(rdCaller)
	c.rd.gen++
	c.rdLimit, c.rdForce = cl.deadline, true
	return c.rd.gen, true
}

// releaseRead, by the caller holding the read side, leaves it unheld, or
// hands it to the reader goroutine when toLoop is set, bytes are buffered
// or a frame is half read, or the Conn is closed (the reader goroutine
// waits for it to return). Calls registered meanwhile get a reader
// (needReader).
func (c *Conn) releaseRead(toLoop bool) {
	c.rdLimit, c.rdForce = time.Time{}, true
	toLoop = toLoop || c.midFrame || (c.rbr != nil && c.rbr.Buffered() > 0)
	if !toLoop {
		c.dropReadBuf()
	}
	c.rd.Lock()
	select {
	case <-c.quit:
		toLoop = true
	default:
	}
	if toLoop {
		c.rd.holder.Store(rdLoop)
	} else {
		c.rd.holder.Store(rdNone)
	}
	c.rd.Unlock()
	if toLoop {
		c.wakeLoop()
		return
	}
	// A call registered before the store above may have seen the read
	// side held and left it to us: give it a reader. (Its registration
	// counts in inflight before it looks at the holder, and the holder is
	// stored here before inflight is read, so one of the two sees the
	// other.)
	if c.inflight.Load() > 0 {
		c.needReader()
	}
}

// needReader makes sure somebody reads the socket: called once a call that
// no caller reads for (InvokeAsync) is registered, and after the read side
// was left unheld with calls in flight.
func (c *Conn) needReader() {
	if c.rd.holder.Load() != rdNone {
		return
	}
	c.rd.Lock()
	if c.rd.holder.Load() != rdNone {
		c.rd.Unlock()
		return
	}
	c.rd.holder.Store(rdLoop)
	c.rd.Unlock()
	c.wakeLoop()
}

func (c *Conn) wakeLoop() {
	select {
	case c.rdWake <- struct{}{}:
	default: // a token is pending: the reader looks at the holder when it takes it
	}
}

// yieldRead runs on the reader goroutine once it completed a sync call:
// when nothing else is in flight and no bytes are buffered, it leaves the
// read side unheld for the next sync caller and waits until the read side
// is its own again (handed back, or taken back after readerGrace). It
// reports whether the Conn closed meanwhile (the reader then holds the
// read side and must return).
func (c *Conn) yieldRead() (closed bool) {
	if c.inflight.Load() > 0 || c.midFrame || (c.rbr != nil && c.rbr.Buffered() > 0) {
		return false
	}
	c.dropReadBuf()
	c.rd.Lock()
	c.rd.holder.Store(rdNone)
	c.rd.Unlock()
	if c.inflight.Load() > 0 {
		c.needReader() // registered meanwhile (see releaseRead)
	}
	if c.rdTimer == nil {
		c.rdTimer = time.NewTimer(readerGrace)
	} else {
		c.rdTimer.Reset(readerGrace)
	}
	defer c.rdTimer.Stop()
	for {
		closed = isDone(c.quit)
		if !closed {
			select {
			case <-c.rdWake:
			case <-c.rdTimer.C:
				c.rdTimer.Reset(readerGrace)
			case <-c.quit:
			}
		}
		c.rd.Lock()
		h := c.rd.holder.Load()
		if h == rdNone {
			h = rdLoop
			c.rd.holder.Store(h)
		}
		c.rd.Unlock()
		if h == rdLoop {
			select {
			case <-c.rdWake: // a token for this very hand-over
			default:
			}
			c.rdForce = true
			return isDone(c.quit)
		}
		if closed {
			// A caller reads: its read fails on the closed socket and
			// it hands the read side back.
			<-c.rdWake
		}
	}
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// readOwn is Invoke for a caller holding the read side (generation gen),
// once req is written: it reads frames until cl's response arrives, ctx
// ends or cl's deadline passes, then lets go of the read side.
func (c *Conn) readOwn(ctx context.Context, req *protocol.Command, cl *call, gen uint64) (*protocol.Command, error) {
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { c.interruptRead(gen) })
	}
	resp, err, toLoop := c.readUntil(ctx, cl)
	c.releaseRead(toLoop)
	if stop != nil {
		stop()
	}
	if err == errHandedOff {
		// The reader goroutine reads on; wait for it as any caller.
		return c.await(ctx, req, cl)
	}
	c.calls.Put(cl)
	if err != nil {
		return nil, callErr(req, err)
	}
	return resp, nil
}

// errHandedOff tells readOwn that its caller met a frame it leaves to the
// reader goroutine (readUntil), and must wait for its response as usual.
var errHandedOff = errors.New("remoting: read side handed to the reader")

// interruptRead, run when a reading caller's ctx ends, wakes the caller of
// generation gen from its socket read, if it still holds the read side
// (the caller then finds its ctx done).
func (c *Conn) interruptRead(gen uint64) {
	c.rd.Lock()
	defer c.rd.Unlock()
	if c.rd.holder.Load() != rdCaller || c.rd.gen != gen {
		return
	}
	_ = c.nc.SetReadDeadline(time.Unix(1, 0)) // fails only once closed; the read then fails
}

// readUntil reads and handles frames until cl is complete, and returns its
// outcome; toLoop tells that the reader goroutine should take over (the
// caller stopped before its response: a late one will come).
//
// A caller completes sync calls (a send on a buffered channel) and hands
// requests to handler goroutines, as the reader does, but it does not run
// InvokeAsync callbacks: they are code of the Conn's user, which may wait
// for the very goroutine that is calling. Such a response is left to the
// reader goroutine (c.handoff) with the read side, and readUntil returns
// errHandedOff.
func (c *Conn) readUntil(ctx context.Context, cl *call) (resp *protocol.Command, err error, toLoop bool) {
	select {
	case r := <-cl.ch:
		// The reader goroutine read the response before it left the read
		// side unheld.
		return r.resp, r.err, false
	default:
	}
	for {
		cmd, rerr := c.nextFrame()
		if rerr != nil {
			if isTimeout(rerr) && !isDone(c.quit) {
				switch {
				case ctx.Err() != nil: // interruptRead, or the deadline passing

					resp, err = c.abandon(cl, ctxErr(ctx))
					return resp, err, true
				case !c.rdLimit.IsZero() && !time.Now().Before(c.rdLimit):
					resp, err = c.abandon(cl, fmt.Errorf("remoting: request opaque %d: %w", cl.opaque, ErrTimeout))
					return resp, err, true
				}
			}
			c.shutdown(c.readError(rerr))
			r := <-cl.ch
			return r.resp, r.err, true
		}
		if cmd.IsResponse() && cmd.Opaque == cl.opaque {
			if _, ok := c.take(cl); ok {
				c.callerRead.Add(1)
				return cmd, nil, false
			}
			// The sweep (deadline) or the close completed the call first.
			c.dropped.Add(1)
			r := <-cl.ch
			return r.resp, r.err, false
		}
		if cmd.IsResponse() && c.isAsync(cmd.Opaque) {
			c.handoff = cmd
			return nil, errHandedOff, true
		}
		c.handleFrame(cmd)
		select {
		case r := <-cl.ch: // the sweep or the close completed it
			return r.resp, r.err, true
		default:
		}
	}
}

// abandon completes cl with err unless its outcome was delivered already.
func (c *Conn) abandon(cl *call, err error) (*protocol.Command, error) {
	if _, ok := c.take(cl); ok {
		return nil, err
	}
	r := <-cl.ch
	return r.resp, r.err
}

// isAsync reports whether opaque is that of a pending InvokeAsync call.
func (c *Conn) isAsync(opaque int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.mu.pending[opaque]
	return ok && cl.cb != nil
}
