// The write side of a Conn: encoding frames, the bounded write queue, the
// direct write by the sending goroutine on an idle plain TCP connection,
// and the writer goroutine that drains the queue in coalesced writes.

package remoting

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func getWriter(w io.Writer) *bufio.Writer {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(w)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}

// outFrame is one encoded frame in the write queue.
type outFrame struct {
	buf    *[]byte
	off    int  // bytes of buf already written (a direct write cut short)
	oneway bool // releases a oneway slot once written
}

// stamp fills in language and version when left zero, and clears the
// response bit of a request.
func (c *Conn) stamp(cmd *protocol.Command) {
	if cmd.Language == 0 {
		cmd.Language = c.cfg.language
	}
	if cmd.Version == 0 {
		cmd.Version = c.cfg.version
	}
}

// encode encodes the request cmd into a pooled buffer, in the Conn's
// serialize type.
func (c *Conn) encode(cmd *protocol.Command) (*[]byte, error) {
	return c.encodeAs(cmd, c.cfg.serialize)
}

// responseType is the header encoding of the response to req: req's own,
// unless WithSerializeType fixed the Conn's.
func (c *Conn) responseType(req *protocol.Command) protocol.SerializeType {
	if c.cfg.serializeSet {
		return c.cfg.serialize
	}
	return req.SerializeType()
}

// encodeAs encodes cmd into a pooled buffer with st headers; in JSON when
// the binary encoding cannot carry cmd (a code or version outside int16).
func (c *Conn) encodeAs(cmd *protocol.Command, st protocol.SerializeType) (*[]byte, error) {
	bp := c.bufs.Get().(*[]byte)
	b, err := cmd.AppendFrame((*bp)[:0], st)
	if err != nil && st == protocol.SerializeRocketMQ && errors.Is(err, protocol.ErrUnencodable) {
		b, err = cmd.AppendFrame((*bp)[:0], protocol.SerializeJSON)
	}
	if err != nil {
		c.putBuf(bp)
		return nil, fmt.Errorf("remoting: encoding code %d: %w", cmd.Code, err)
	}
	*bp = b
	return bp, nil
}

func (c *Conn) putBuf(bp *[]byte) {
	if cap(*bp) <= maxPooledBuf {
		*bp = (*bp)[:0]
		c.bufs.Put(bp)
	}
}

// acquire takes a slot of sem, waiting as ctx allows.
func (c *Conn) acquire(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx)
	case <-c.quit:
		return c.closedErr()
	}
}

// enqueue queues f for the socket, waiting for room as ctx allows.
func (c *Conn) enqueue(ctx context.Context, f outFrame) error {
	select {
	case <-c.quit:
		c.putBuf(f.buf)
		return c.closedErr()
	default:
	}
	n := int64(len(*f.buf))
	c.queued.Add(1)
	c.queuedB.Add(n)
	for {
		room, _ := c.push(f, true)
		if room == nil {
			return nil
		}
		select {
		case <-room:
		case <-ctx.Done():
			c.queued.Add(-1)
			c.queuedB.Add(-n)
			c.putBuf(f.buf)
			return ctxErr(ctx)
		case <-c.quit:
			c.queued.Add(-1)
			c.queuedB.Add(-n)
			c.putBuf(f.buf)
			return c.closedErr()
		}
	}
}

// tryEnqueue queues f without waiting; a full queue closes the connection
// with ErrWriteQueueFull. Used for responses, which must never block.
func (c *Conn) tryEnqueue(f outFrame) error {
	select {
	case <-c.quit:
		c.putBuf(f.buf)
		return c.closedErr()
	default:
	}
	n := int64(len(*f.buf))
	c.queued.Add(1)
	// A frame is always accepted into an empty queue, whatever its size.
	if b, lim := c.queuedB.Add(n), c.cfg.maxQueuedB; lim > 0 && b > lim && b != n {
		c.queued.Add(-1)
		c.queuedB.Add(-n)
		c.putBuf(f.buf)
		c.logClose("remoting: closing connection: queued output over its byte bound", "bytes", b, "limit", lim)
		c.shutdown(ErrWriteQueueBytes)
		return c.closedErr()
	}
	if _, full := c.push(f, false); full {
		c.queued.Add(-1)
		c.queuedB.Add(-n)
		c.putBuf(f.buf)
		c.logClose("remoting: closing connection: write queue full", "frames", c.cfg.writeQueue)
		c.shutdown(ErrWriteQueueFull)
		return c.closedErr()
	}
	return nil
}

// push hands f, counted in queued and queuedB, to the socket: it writes f
// at once when it can (directly), else appends it to the write queue and
// starts the writer. When the queue is full it does nothing and reports
// full, with (wait) a channel closed once there is room.
//
// A direct write needs a plain TCP connection whose write side is free,
// an empty queue (frames queued earlier go first) and no sign that more
// frames follow soon (moreFramesLikely): when they do, the writer coalesces
// them into one socket write instead.
func (c *Conn) push(f outFrame, wait bool) (room chan struct{}, full bool) {
	c.wq.Lock()
	if c.wq.closed {
		c.wq.Unlock()
		c.drop(f, len(*f.buf)-f.off)
		return nil, false
	}
	if c.sock != nil && !c.wq.writing && len(c.wq.frames) == 0 && !c.moreFramesLikely() {
		c.wq.writing = true
		c.wq.Unlock()
		c.writeDirect(f)
		return nil, false
	}
	if len(c.wq.frames) >= c.cfg.writeQueue {
		if wait {
			if c.wq.room == nil {
				c.wq.room = make(chan struct{})
			}
			room = c.wq.room
		}
		c.wq.Unlock()
		return room, true
	}
	c.wq.frames = append(c.wq.frames, f)
	c.startWriterLocked()
	c.wq.Unlock()
	return nil, false
}

// drop forgets the frame f, of which n bytes were not written, queued
// when the Conn closed.
func (c *Conn) drop(f outFrame, n int) {
	c.queued.Add(-1)
	c.queuedB.Add(-int64(n))
	c.putBuf(f.buf)
	if f.oneway {
		<-c.onewaySem
	}
}

// writeDirect writes f on the calling goroutine, which owns the write side
// (wq.writing), without waiting: what the socket does not take goes back
// to the head of the queue for the writer.
func (c *Conn) writeDirect(f outFrame) {
	b := (*f.buf)[f.off:]
	n, err := c.sock.write(b)
	if err != nil {
		c.wq.Lock()
		c.wq.writing = false
		c.wq.Unlock()
		c.drop(f, len(b))
		c.shutdown(fmt.Errorf("remoting: write: %w", err))
		return
	}
	if n == len(b) {
		c.wrote(f, len(b))
		c.queued.Add(-1)
		c.wq.Lock()
		c.wq.writing = false
		if len(c.wq.frames) > 0 {
			c.startWriterLocked() // frames queued meanwhile: the writer may have left them
		}
		c.wq.Unlock()
		return
	}
	c.queuedB.Add(-int64(n))
	c.bytes.Add(int64(n))
	c.cut.Add(1)
	if c.onCut != nil {
		c.onCut()
	}
	f.off += n
	c.wq.Lock()
	c.wq.frames = slices.Insert(c.wq.frames, 0, f)
	c.wq.writing = false
	c.startWriterLocked()
	c.wq.Unlock()
}

// wrote accounts for the frame f whose last n bytes were just handed to
// the socket (or its buffer): counters, hooks, its buffer and oneway slot.
func (c *Conn) wrote(f outFrame, n int) {
	c.queuedB.Add(-int64(n))
	c.framesOut.Add(1)
	c.bytes.Add(int64(n))
	if len(c.hooks.written) > 0 {
		size := len(*f.buf)
		for _, h := range c.hooks.written {
			h.OnFrameWritten(c, size)
		}
	}
	c.putBuf(f.buf)
	if f.oneway {
		<-c.onewaySem
	}
}

// writeResponse sends resp as the answer to req (nothing for a oneway
// request). It never blocks: a full write queue closes the connection.
func (c *Conn) writeResponse(req, resp *protocol.Command) error {
	if req.IsOneway() {
		return nil
	}
	resp.Opaque = req.Opaque
	resp.Flag = (resp.Flag | protocol.FlagResponse) &^ protocol.FlagOneway
	c.stamp(resp)
	st := c.responseType(req)
	bp, err := c.encodeAs(resp, st)
	if err != nil {
		// The processor built a response this encoding cannot carry; tell the
		// peer instead of leaving it waiting.
		if c.cfg.limitHit != nil {
			c.cfg.limitHit(limitUnencodable, c.remote, "code", resp.Code, "err", err)
		} else {
			c.log.Warn("remoting: response not encodable", "code", resp.Code, "err", err)
		}
		fallback := protocol.NewResponse(req, protocol.ResSystemError, err.Error())
		c.stamp(fallback)
		if bp, err = c.encodeAs(fallback, st); err != nil {
			return err
		}
	}
	return c.tryEnqueue(outFrame{buf: bp})
}

// writeLoop is the writer goroutine: it writes the queued frames and
// returns once the queue is empty (or a direct writer owns the write side:
// that one starts a writer again if it leaves frames behind), or the
// connection failed or closed.
func (c *Conn) writeLoop() {
	defer c.wg.Done()
	for {
		if err := c.drain(); err != nil {
			c.wq.Lock()
			c.wq.writer = false
			c.wq.Unlock()
			if isTimeout(err) {
				c.logClose("remoting: closing connection: write timed out (peer not reading)", "timeout", c.cfg.writeTimeout)
			}
			c.shutdown(fmt.Errorf("remoting: write: %w", err))
			return
		}
		c.wq.Lock()
		if c.wq.closed || c.wq.writing || len(c.wq.frames) == 0 {
			c.wq.writer = false
			c.wq.Unlock()
			return
		}
		c.wq.Unlock()
	}
}

// drain writes the queued frames, batch after batch, until the queue is
// empty or a direct writer owns the write side (it kicks the writer when
// it leaves frames behind). A batch goes through a pooled bufio.Writer,
// held only while draining, in as few socket writes as it fits.
func (c *Conn) drain() error {
	var bw *bufio.Writer
	defer func() {
		if bw != nil {
			putWriter(bw)
		}
	}()
	for {
		c.wq.Lock()
		if c.wq.closed || c.wq.writing || len(c.wq.frames) == 0 {
			c.wq.Unlock()
			return nil
		}
		batch := c.take1()
		c.wq.writing = true
		c.wq.Unlock()
		if bw == nil {
			bw = getWriter(c.nc)
		}
		if c.cfg.writeTimeout > 0 {
			_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.writeTimeout)) // fails only once closed; the write then fails
		}
		batch, err := c.writeBatch(bw, batch)
		c.wq.Lock()
		c.wq.writing = false
		if cap(batch) <= maxSpareFrames && c.wq.spare == nil {
			c.wq.spare = batch[:0]
		}
		c.wq.Unlock()
		if err != nil {
			return err
		}
	}
}

// take1 takes the queued frames for writing, leaving an empty queue.
// Requires c.wq.
func (c *Conn) take1() []outFrame {
	batch := c.wq.frames
	c.wq.frames, c.wq.spare = c.wq.spare, nil
	if c.wq.room != nil {
		close(c.wq.room)
		c.wq.room = nil
	}
	return batch
}

// writeBatch writes batch and flushes. When more frames are likely soon it
// first lets the goroutines producing them run once and writes what they
// queued in the same flush. It returns the (cleared) slice last used.
func (c *Conn) writeBatch(bw *bufio.Writer, batch []outFrame) ([]outFrame, error) {
	var err error
	n := 0
	for yielded := false; ; yielded = true {
		for i := range batch {
			if err == nil {
				b := (*batch[i].buf)[batch[i].off:]
				_, err = bw.Write(b)
				c.wrote(batch[i], len(b))
			} else {
				c.putBuf(batch[i].buf)
			}
		}
		n += len(batch)
		clear(batch)
		if err != nil || yielded || !c.moreFramesLikely() {
			break
		}
		runtime.Gosched()
		c.wq.Lock()
		if len(c.wq.frames) == 0 {
			c.wq.Unlock()
			break
		}
		c.wq.spare = batch[:0]
		batch = c.take1()
		c.wq.Unlock()
	}
	if err == nil {
		err = bw.Flush()
	}
	c.queued.Add(-int64(n))
	return batch, err
}

// moreFramesLikely reports whether frames other than those being written
// are on their way: other requests being served (their responses), or
// calls awaiting responses (callers pipelining requests).
func (c *Conn) moreFramesLikely() bool {
	return c.handling.Load() > 1 || c.inflight.Load() > 1
}
