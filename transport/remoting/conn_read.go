// The read side of a Conn: the reader goroutine, frame reading with pooled
// buffers held only while bytes arrive, the read deadline, and dispatching
// a frame to its pending call or to a handler.

package remoting

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func getReader(r io.Reader) *bufio.Reader {
	br := readers.Get().(*bufio.Reader)
	br.Reset(r)
	return br
}

func putReader(br *bufio.Reader) {
	br.Reset(nil)
	readers.Put(br)
}

// frameSource is what a connection's read buffer reads from: the bytes
// of a partial frame set aside (Conn.stash), then the socket, whose bytes
// it counts.
type frameSource struct{ c *Conn }

func (r frameSource) Read(p []byte) (int, error) {
	c := r.c
	n := 0
	if len(c.stash) > 0 {
		// A fresh buffer takes the whole stash (it is shorter than
		// readBufSize): the socket, which has the rest queued, fills in
		// behind it in the same read.
		n = copy(p, c.stash)
		if n < len(c.stash) {
			c.stash = c.stash[:copy(c.stash, c.stash[n:])]
			return n, nil
		}
		if cap(c.stash) > maxKeptStash {
			c.stash = nil
		} else {
			c.stash = c.stash[:0]
		}
	}
	m, err := c.nc.Read(p[n:])
	c.bytesIn.Add(int64(m))
	if err != nil {
		c.readFailed = true
	}
	return n + m, err
}

// maxKeptStash is the largest stash a connection keeps for the next
// partial frame once its bytes are back in a read buffer.
const maxKeptStash = 1 << 10

// frameShortfall reports, for a plain TCP connection where the system
// tells how many bytes are queued, how many more bytes the socket must
// queue before the frame at the head of br can be read without waiting
// mid-frame: 0 when they are there (or when the read is to report an
// error: a malformed length, EOF). "The frame" is capped at readBufSize
// bytes: a larger one is read as it arrives once a buffer's worth is in.
// br holds at least a byte, or gets one (the socket was reported readable).
func (c *Conn) frameShortfall(br *bufio.Reader) int {
	if br.Buffered() == 0 {
		if _, err := br.Peek(1); err != nil {
			return 0 // the read reports it
		}
	}
	have, need := br.Buffered(), 4
	if have >= 4 {
		w, _ := br.Peek(4) // buffered: cannot fail
		l := int64(int32(binary.BigEndian.Uint32(w)))
		if l < 4 || l > int64(c.cfg.maxFrame) {
			return 0 // malformed: the read refuses it
		}
		need = int(min(4+l, readBufSize))
	}
	if have >= need || c.readFailed {
		return 0 // all there, or no more will come: the read reports it
	}
	q := c.sock.queued()
	if q < 0 || have+q >= need {
		return 0
	}
	return need - have
}

// readLoop is the reader goroutine: it reads frames and handles them
// until the connection fails, and returns the cause. On a client Conn it
// leaves the read side to sync callers between calls (yieldRead).
func (c *Conn) readLoop() error {
	defer c.dropReadBuf()
	for {
		cmd, err := c.nextFrame()
		if err != nil {
			return c.readError(err)
		}
		if c.handleFrame(cmd) && c.callerReads {
			if c.yieldRead() {
				return c.closedErr()
			}
		}
	}
}

// dropReadBuf gives the read buffer back to its pool. Only the holder of
// the read side.
func (c *Conn) dropReadBuf() {
	if c.rbr != nil {
		putReader(c.rbr)
		c.rbr = nil
	}
}

// handleFrame completes the call the response cmd answers, or serves the
// request cmd. It reports whether it completed a sync call.
func (c *Conn) handleFrame(cmd *protocol.Command) bool {
	if cmd.IsResponse() {
		return c.deliver(cmd)
	}
	c.handleRequest(cmd)
	return false
}

// nextFrame reads the next frame; only the holder of the read side calls
// it.
//
// On a plain TCP connection the read buffer is held only while bytes are
// buffered or a frame is being read: when a frame ends the buffer empty,
// the buffer goes back to its pool and the reader waits for the socket to
// have bytes (sock.waitReadable) before taking one again, so that an idle
// connection holds none. Where the system tells how many bytes a socket
// has queued (Linux), a frame is read only once it is all there (or a
// buffer's worth of a larger one): the bytes of a partial frame are set
// aside (c.stash), the buffer given back, and the reader waits for the
// rest (sock.waitQueued), so that a peer trickling a frame in holds no
// buffer and wakes the reader a few times per frame, not once per byte.
func (c *Conn) nextFrame() (*protocol.Command, error) {
	if cmd := c.handoff; cmd != nil {
		c.handoff = nil
		return cmd, nil
	}
	for {
		c.armReadDeadline()
		if c.sock != nil && (c.rbr == nil || c.rbr.Buffered() == 0) {
			c.dropReadBuf()
			if err := c.sock.waitReadable(); err != nil {
				return nil, err
			}
		}
		if c.rbr == nil {
			c.rbr = getReader(frameSource{c})
		}
		if c.sock != nil && frameWaitSupported {
			if short := c.frameShortfall(c.rbr); short > 0 {
				// A partial frame, the rest not queued: set its bytes
				// aside and give the buffer back until the rest is there.
				b, _ := c.rbr.Peek(c.rbr.Buffered()) // buffered: cannot fail
				c.stash = append(c.stash[:0], b...)
				c.dropReadBuf()
				c.midFrame = true
				if err := c.sock.waitQueued(short); err != nil {
					return nil, err
				}
				continue
			}
		}
		cmd, err := protocol.ReadFrame(c.rbr, c.cfg.maxFrame)
		if err != nil {
			return nil, err
		}
		c.midFrame = false
		c.framesIn.Add(1)
		if more := c.rbr.Buffered() > 0; more != c.readAhead.Load() {
			c.readAhead.Store(more)
		}
		for _, h := range c.hooks.read {
			h.OnFrameRead(c, cmd)
		}
		return cmd, nil
	}
}

// armReadDeadline sets the socket's read deadline: the idle timeout from
// now, or the holding caller's call deadline when that is earlier. The
// idle deadline is pushed forward only when it has aged by a sixteenth of
// the idle timeout, sparing a syscall-side timer update per frame: a peer
// thus gets between 15/16 and all of the idle timeout. A frame waited for
// in parts (midFrame) keeps the deadline set before its first byte, as one
// read of it would, unless the read side changed hands (rdForce).
func (c *Conn) armReadDeadline() {
	idle := c.cfg.idleTimeout
	if !c.rdForce && (idle <= 0 || c.midFrame) {
		return
	}
	now := time.Now()
	if !c.rdForce && now.Sub(c.deadlineSet) <= idle/16 {
		return
	}
	var dl time.Time
	if idle > 0 {
		dl = now.Add(idle)
	}
	if lim := c.rdLimit; !lim.IsZero() && (dl.IsZero() || lim.Before(dl)) {
		dl = lim
	}
	_ = c.nc.SetReadDeadline(dl) // fails only once closed; the read then fails
	c.deadlineSet, c.rdForce = now, false
}

// readError classifies and logs a read failure, returning the close cause.
func (c *Conn) readError(err error) error {
	select {
	case <-c.quit:
		return err // closed by us; the read failure is the consequence
	default:
	}
	switch {
	case errors.Is(err, io.EOF):
		c.log.Debug("remoting: peer closed the connection")
		return fmt.Errorf("remoting: peer closed: %w", err)
	case errors.Is(err, protocol.ErrMalformedFrame):
		c.logClose("remoting: closing connection: malformed frame", "err", err)
		return err
	case isTimeout(err):
		c.log.Debug("remoting: closing idle connection", "idle_timeout", c.cfg.idleTimeout)
		return fmt.Errorf("remoting: no frame for %v: %w", c.cfg.idleTimeout, err)
	default:
		c.log.Debug("remoting: read failed", "err", err)
		return fmt.Errorf("remoting: read: %w", err)
	}
}

// logClose logs why the connection is being closed for a fault of its
// peer: at Warn for a Conn of its own; at Debug on a Server's connection,
// whose Server counts and logs the close at most once per interval
// (ServerStats, WithLimitLogInterval), so that many bad peers do not flood
// the log.
func (c *Conn) logClose(msg string, args ...any) {
	lvl := slog.LevelWarn
	if c.cfg.limitHit != nil {
		lvl = slog.LevelDebug
	}
	c.log.Log(context.Background(), lvl, msg, args...)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
