package remoting

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"runtime/pprof"
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
