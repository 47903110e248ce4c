package remoting

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

const (
	// readBufSize and writeBufSize are the sizes of the bufio buffers a
	// connection reads and writes through. They are pooled (readers,
	// writers): a connection holds its write buffer only while its writer
	// goroutine drains frames, and (plain TCP) its read buffer only while
	// bytes are arriving, so that idle connections cost no buffers.
	readBufSize  = 32 << 10
	writeBufSize = 32 << 10
	// maxPooledBuf is the largest encode buffer returned to the pool; larger
	// ones (big bodies) are left to the garbage collector.
	maxPooledBuf = 64 << 10
	// maxSpareFrames is the largest write-queue slice kept for reuse once
	// drained; a larger one (a burst's backlog) is left to the garbage
	// collector.
	maxSpareFrames = 64
)

// readers and writers pool the bufio buffers of connections (process-wide
// caches of free buffers, holding no state of any connection).
var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufSize) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufSize) }}
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

func getWriter(w io.Writer) *bufio.Writer {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(w)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}

// RequestHandler handles a request the peer sent on a Conn (a
// server-initiated request, for a client). It runs on its own goroutine (at
// most WithMaxConcurrentHandlers at once); ctx is cancelled when the Conn
// closes. The returned command is sent as the response, with the request's
// opaque and the response flag set by the Conn; nil means no response.
// Requests with the oneway bit are never answered, whatever is returned.
// req is owned by the handler. A handler must not call Close on c (Close
// waits for handlers).
type RequestHandler func(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command

// Stats is a snapshot of a connection's counters.
type Stats struct {
	InFlight         int64 // calls (sync and async) awaiting their response
	DroppedResponses int64 // responses whose opaque matched no pending call (late or unknown)
	RejectedRequests int64 // incoming requests refused because every handler slot was busy
	FramesIn         int64 // frames read and decoded
	FramesOut        int64 // frames handed to the socket
	BytesIn          int64 // bytes read from the socket
	BytesOut         int64 // bytes of frames handed to the socket
	// CallerReads counts the sync calls whose response their caller read
	// itself (WithCallerReads) rather than the reader goroutine.
	CallerReads int64
}

// call is one pending request: a sync call (ch) or an async one (cb).
type call struct {
	opaque int32
	ch     chan result                    // sync: buffered 1, receives exactly one result
	cb     func(*protocol.Command, error) // async
	stop   func() bool                    // async: stops the ctx AfterFunc; guarded by Conn.mu
	// deadline, if set, is when an InvokeAsyncTimeout call times out; the
	// Conn's sweep timer enforces it. Immutable once registered.
	deadline time.Time
}

type result struct {
	resp *protocol.Command
	err  error
}

// outFrame is one encoded frame in the write queue.
type outFrame struct {
	buf    *[]byte
	off    int  // bytes of buf already written (a direct write cut short)
	oneway bool // releases a oneway slot once written
}

// Conn is one multiplexed RocketMQ remoting connection: requests in both
// directions share it and responses are matched to their requests by opaque,
// in any order. It is the client side of a connection (Dial, NewConn) and
// also, embedded in ServerConn, the server side.
//
// A Conn runs three kinds of goroutines, all joined by Close: one reader
// (bufio, decodes frames, completes pending calls, hands incoming requests to
// handler goroutines; between sync calls it may leave the reading to the
// callers themselves, see WithCallerReads), a writer while frames are queued (drains the bounded
// write queue and coalesces frames into one buffered write; started when a
// frame is queued, gone once the queue is empty), and up to
// WithMaxConcurrentHandlers handler goroutines. On a plain TCP connection
// with nothing queued and nothing else in flight, a frame is written by the
// goroutine sending it (a non-blocking write; what the socket does not take
// at once is left to the writer), sparing the hand-off to the writer.
//
// All methods are safe for concurrent use. A Conn never reconnects: once
// closed (by Close, a read or write error, the idle timeout, or a malformed
// frame) every call fails with ErrConnClosed, and owners watch Done to
// replace it.
type Conn struct {
	cfg    connConfig
	log    *slog.Logger
	hooks  hooks
	nc     net.Conn
	remote net.Addr
	local  net.Addr

	// dispatch handles one incoming request on a handler goroutine.
	dispatch func(ctx context.Context, req *protocol.Command)
	// inline, if set, may handle an incoming request on the reader
	// goroutine instead; it reports whether it did.
	inline func(req *protocol.Command) bool

	// ctx is the connection's lifetime context, given to handlers; cancel
	// runs at close.
	ctx    context.Context
	cancel context.CancelFunc

	opaque atomic.Int32

	mu struct {
		sync.Mutex
		pending map[int32]*call // nil once closed
		err     error           // the close error, set once
		// sweep fails InvokeAsyncTimeout calls past their deadline: one
		// timer per Conn, armed for the earliest deadline it knows of
		// (sweepAt) while such calls are pending.
		sweep   *time.Timer
		sweepAt time.Time
		timed   int // pending calls with a deadline
	}

	asyncSem   chan struct{}
	onewaySem  chan struct{}
	handlerSem chan struct{}
	// wq is the write queue: frames waiting for the socket, in order, at
	// most cfg.writeQueue of them. The socket's write side has one owner
	// at a time (writing): the writer goroutine draining frames, or a
	// goroutine writing its own frame directly (sock.write) because the
	// queue was empty.
	wq struct {
		sync.Mutex
		frames  []outFrame
		spare   []outFrame    // a drained slice kept for reuse
		writing bool          // the socket's write side is owned
		writer  bool          // the writer goroutine runs
		closed  bool          // shutdown began: no writer starts, frames are dropped
		room    chan struct{} // closed when frames are taken; nil when no one waits
	}
	// sock, for a plain TCP connection, does the direct writes and lets
	// the reader wait for bytes without holding a read buffer; nil
	// otherwise.
	sock      *sock
	work      chan *protocol.Command // unbuffered: hands a request to a parked worker
	idle      atomic.Int32           // parked workers
	quit      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	bufs  sync.Pool // *[]byte encode buffers
	calls sync.Pool // *call for sync Invoke

	queued   atomic.Int64 // frames enqueued but not yet flushed
	queuedB  atomic.Int64 // bytes of frames enqueued but not yet written
	handling atomic.Int64 // server side: requests being processed or deferred
	// The read side's state, used only by the goroutine holding the read
	// side (rd; the reader goroutine, or a caller reading its own
	// response): the read buffer (pooled; nil while no bytes are
	// buffered), stash holds the bytes of a partial frame while the holder
	// waits for the rest without a buffer, midFrame tells that a frame is
	// being read in parts, readFailed that a socket read failed (EOF
	// included: no more bytes will come), deadlineSet when the idle read
	// deadline was last pushed forward, rdLimit the read deadline of the
	// holding caller's call (zero for the reader goroutine), rdForce that
	// the read deadline must be set anew (the holder changed).
	rbr         *bufio.Reader
	stash       []byte
	midFrame    bool
	readFailed  bool
	deadlineSet time.Time
	rdLimit     time.Time
	rdForce     bool
	// handoff is a frame a caller read and left to the reader goroutine
	// (see readUntil): the next frame nextFrame returns.
	handoff *protocol.Command
	// rd tells who holds the read side (callerread.go).
	rd struct {
		sync.Mutex
		holder atomic.Int32 // rdLoop, rdCaller or rdNone; changed under the mutex
		gen    uint64       // counts the callers that took the read side
	}
	// callerReads: a sync call may read its own response (client Conns on
	// plain TCP; WithCallerReads).
	callerReads bool
	// rdWake hands the read side back to the reader goroutine (a token:
	// the reader checks rd.holder when it wakes).
	rdWake  chan struct{}
	rdTimer *time.Timer // the reader goroutine's, while the read side is unheld
	// readAhead is set by the reader when bytes past the frame it just read
	// are buffered (the peer sent more already); see ReadAhead.
	readAhead atomic.Bool

	inflight, dropped, rejected         atomic.Int64
	framesIn, framesOut, bytesIn, bytes atomic.Int64
	cut                                 atomic.Int64 // direct writes the socket took only part of
	callerRead                          atomic.Int64 // Stats.CallerReads
	// writeLoopFn is writeLoop bound once, so that starting the writer
	// allocates no closure.
	writeLoopFn func()
	// onCut, if set (by tests), runs when a direct write was cut short,
	// before the rest is queued.
	onCut func()
}

// Dial connects to addr ("host:port") over TCP, or TLS with WithTLSConfig,
// and returns the running Conn. ctx bounds the dial only; the Conn lives
// until Close or a connection failure.
func Dial(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	cfg := defaultConnConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var (
		nc  net.Conn
		err error
		d   net.Dialer
	)
	if cfg.tls != nil {
		td := tls.Dialer{NetDialer: &d, Config: cfg.tls}
		nc, err = td.DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("remoting: dial %s: %w", addr, err)
	}
	return startClientConn(nc, cfg), nil
}

// NewConn wraps an established connection (its TLS, if any, already set up)
// and starts serving it. The Conn owns nc from then on and closes it.
// WithTLSConfig is ignored.
func NewConn(nc net.Conn, opts ...Option) (*Conn, error) {
	cfg := defaultConnConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return startClientConn(nc, cfg), nil
}

func startClientConn(nc net.Conn, cfg connConfig) *Conn {
	c := newConn(context.Background(), nc, cfg)
	c.dispatch = c.dispatchHandler
	c.callerReads = c.sock != nil && !cfg.noCallerReads
	c.wg.Add(1)
	go pprof.Do(c.ctx, pprof.Labels("remoting", "reader"), func(context.Context) {
		defer c.wg.Done()
		c.shutdown(c.readLoop())
	})
	return c
}

func newSockUnless(off bool, nc net.Conn) *sock {
	if off {
		return nil
	}
	return newSock(nc)
}

// newConn builds a Conn around nc without starting it. parent is the
// ancestor of the lifetime ctx handlers get.
func newConn(parent context.Context, nc net.Conn, cfg connConfig) *Conn {
	c := &Conn{
		cfg:        cfg,
		log:        cfg.logger.With("remote", nc.RemoteAddr().String()),
		hooks:      newHooks(cfg.hooks),
		nc:         nc,
		remote:     nc.RemoteAddr(),
		local:      nc.LocalAddr(),
		asyncSem:   make(chan struct{}, cfg.maxAsync),
		onewaySem:  make(chan struct{}, cfg.maxOneway),
		handlerSem: make(chan struct{}, cfg.handlers),
		sock:       newSockUnless(cfg.noSock, nc),
		work:       make(chan *protocol.Command),
		quit:       make(chan struct{}),
		rdWake:     make(chan struct{}, 1),
	}
	c.ctx, c.cancel = context.WithCancel(parent)
	c.writeLoopFn = c.writeLoop
	c.mu.pending = make(map[int32]*call)
	c.bufs.New = func() any { b := make([]byte, 0, 512); return &b }
	c.calls.New = func() any { return &call{ch: make(chan result, 1)} }
	return c
}

// startWriterLocked starts the writer goroutine unless it runs or the
// Conn is closing. Requires c.wq. Starting it only under c.wq, never once
// shutdown marked the queue closed, orders every wg.Add before Close's
// wg.Wait.
func (c *Conn) startWriterLocked() {
	if c.wq.writer || c.wq.closed {
		return
	}
	c.wq.writer = true
	c.wg.Add(1)
	go c.writeLoopFn()
}

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// LocalAddr returns this side's address.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// Done returns a channel closed when the connection has closed (for any
// reason). Err then tells why.
func (c *Conn) Done() <-chan struct{} { return c.quit }

// Err returns nil while the connection is open, and afterwards the error
// every call fails with: it wraps ErrConnClosed and the cause.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.err
}

// Stats returns a snapshot of the connection's counters.
func (c *Conn) Stats() Stats {
	return Stats{
		InFlight:         c.inflight.Load(),
		DroppedResponses: c.dropped.Load(),
		RejectedRequests: c.rejected.Load(),
		FramesIn:         c.framesIn.Load(),
		FramesOut:        c.framesOut.Load(),
		BytesIn:          c.bytesIn.Load(),
		BytesOut:         c.bytes.Load(),
		CallerReads:      c.callerRead.Load(),
	}
}

// Handling returns, on a Server's connection, how many requests are being
// served or await their deferred response (the one being served
// included): above 1, the peer pipelines requests. Always 0 on a client
// Conn.
func (c *Conn) Handling() int64 { return c.handling.Load() }

// ReadAhead reports whether, when the reader read the frame it handles or
// handed off last, bytes past that frame were already buffered: the peer
// had sent more (it pipelines requests). Meant for a processor running on
// the reader goroutine (Server.HandleInline), for which that frame is its
// own request.
func (c *Conn) ReadAhead() bool { return c.readAhead.Load() }

// Close closes the connection: the socket is closed, every pending call
// fails with an error wrapping ErrConnClosed, and Close waits for the
// reader, the writer and running handlers (whose ctx is cancelled) to
// return. Frames still queued are discarded. Close is idempotent and returns
// nil. It must not be called from a RequestHandler or an InvokeAsync
// callback of the same Conn, which it would wait for.
func (c *Conn) Close() error {
	c.shutdown(errLocalClose)
	c.wg.Wait()
	return nil
}

// shutdown closes the connection with cause without waiting for its
// goroutines. The first call wins; later ones do nothing.
func (c *Conn) shutdown(cause error) {
	c.closeOnce.Do(func() {
		err := &closedError{cause: cause}
		c.wq.Lock()
		c.wq.closed = true
		c.wq.Unlock()
		c.mu.Lock()
		pending := c.mu.pending
		c.mu.pending = nil
		c.mu.err = err
		if c.mu.sweep != nil {
			c.mu.sweep.Stop()
		}
		// Read stop funcs while holding the lock that guards them.
		stops := make([]func() bool, 0, len(pending))
		for _, cl := range pending {
			stops = append(stops, cl.stop)
		}
		c.mu.Unlock()
		close(c.quit)
		c.cancel()
		_ = c.nc.Close() // the socket is being discarded; its close error says nothing new
		i := 0
		for _, cl := range pending {
			c.inflight.Add(-1)
			c.complete(cl, stops[i], nil, err)
			i++
		}
		for _, h := range c.hooks.closed {
			h.OnConnClosed(c, err)
		}
		c.log.Debug("remoting: connection closed", "cause", cause, "failed_pending", len(pending))
	})
}

// closedErr returns the close error; only valid once quit is closed.
func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.err == nil {
		return ErrConnClosed
	}
	return c.mu.err
}

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

// handleRequest serves req on the reader goroutine when the server's
// processor asks for it (Server.HandleInline). Otherwise it runs dispatch for
// req on a handler goroutine, or answers SYSTEM_BUSY when every handler slot
// is taken, so the reader never waits.
// A slot is taken for each request being handled; the request goes to a
// parked idle worker when there is one (saving a goroutine start and its
// stack growth), else to a new worker.
func (c *Conn) handleRequest(req *protocol.Command) {
	if c.inline != nil && c.inline(req) {
		return
	}
	select {
	case c.handlerSem <- struct{}{}:
	default:
		c.rejected.Add(1)
		c.log.Debug("remoting: rejecting request: handlers busy", "code", req.Code, "limit", cap(c.handlerSem))
		_ = c.writeResponse(req, protocol.NewResponse(req, protocol.ResSystemBusy, "[OVERLOAD]system busy, start flow control for a while")) // a failure closed the connection, which reports it
		return
	}
	select {
	case c.work <- req:
		return
	default:
	}
	c.wg.Add(1)
	go c.worker(req)
}

// maxIdleWorkers bounds the handler goroutines a connection keeps parked
// for the next request.
const maxIdleWorkers = 8

// worker handles req, then parks waiting for more work unless enough
// workers are parked already. A parked worker holds no handler slot.
func (c *Conn) worker(req *protocol.Command) {
	defer c.wg.Done()
	for {
		c.dispatch(c.ctx, req)
		<-c.handlerSem
		if c.idle.Add(1) > maxIdleWorkers {
			c.idle.Add(-1)
			return
		}
		select {
		case req = <-c.work:
			c.idle.Add(-1)
		case <-c.quit:
			c.idle.Add(-1)
			return
		}
	}
}

// dispatchHandler is a client Conn's dispatch: the RequestHandler.
func (c *Conn) dispatchHandler(ctx context.Context, req *protocol.Command) {
	var resp *protocol.Command
	if c.cfg.handler == nil {
		resp = notSupported(req)
	} else {
		resp = c.cfg.handler(ctx, c, req)
	}
	if resp != nil {
		_ = c.writeResponse(req, resp) // a failure closed the connection, which reports it
	}
}

func notSupported(req *protocol.Command) *protocol.Command {
	return protocol.NewResponse(req, protocol.ResRequestCodeNotSupported, " request type "+strconv.Itoa(int(req.Code))+" not supported")
}
