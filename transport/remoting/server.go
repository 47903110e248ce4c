package remoting

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Processor handles the requests of one or more request codes on a Server.
//
// ProcessRequest runs on its own goroutine (at most WithMaxConcurrentHandlers
// per connection); ctx is cancelled when the connection or the Server closes.
// It returns the response, which the Server sends with the request's opaque
// and the response flag; or an error, answered with SYSTEM_ERROR and the
// error text as remark (or with the code and remark of a *protocol.Error);
// or (nil, nil) for no response now: after rc.Defer() the processor (or any
// goroutine it hands rc to) answers later with rc.Respond, exactly once —
// long-polling pulls do this. Without Defer, (nil, nil) means no response at
// all. Oneway requests are never answered, whatever is returned.
type Processor interface {
	ProcessRequest(ctx context.Context, rc *RequestCtx) (*protocol.Command, error)
}

// ProcessorFunc adapts a function to Processor.
type ProcessorFunc func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error)

// ProcessRequest calls f(ctx, rc).
func (f ProcessorFunc) ProcessRequest(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
	return f(ctx, rc)
}

// RequestCtx is one request being served: the request, the connection it came
// on, and the means to answer it later. It may be used from any goroutine.
type RequestCtx struct {
	req   *protocol.Command
	conn  *ServerConn
	state atomic.Uint32
}

const (
	rcDeferred uint32 = 1 << iota
	rcResponded
)

// Request returns the request. The processor owns it for the life of rc.
func (rc *RequestCtx) Request() *protocol.Command { return rc.req }

// Conn returns the connection the request came on.
func (rc *RequestCtx) Conn() *ServerConn { return rc.conn }

// RemoteAddr returns the requesting peer's address.
func (rc *RequestCtx) RemoteAddr() net.Addr { return rc.conn.remote }

// Defer marks the request as answered later with Respond: the processor then
// returns (nil, nil). Defer must be called before ProcessRequest returns. A
// deferred request counts as in flight for Shutdown until Respond is called
// or its connection closes. Defer after Respond does nothing.
func (rc *RequestCtx) Defer() {
	for {
		old := rc.state.Load()
		if old&(rcResponded|rcDeferred) != 0 || rc.state.CompareAndSwap(old, old|rcDeferred) {
			return
		}
	}
}

// Respond sends resp as the response to the request, with the request's
// opaque and the response flag, in the header encoding of the request (or
// the one WithSerializeType fixed for the Server). Only the
// first call counts; later ones return ErrAlreadyResponded. A nil resp, or
// a oneway request, sends nothing but still ends the request. Respond never
// blocks: when the connection's write queue is full the connection is closed
// (ErrWriteQueueFull). It returns an error wrapping ErrConnClosed when the
// connection is gone.
func (rc *RequestCtx) Respond(resp *protocol.Command) error {
	var old uint32
	for {
		old = rc.state.Load()
		if old&rcResponded != 0 {
			return ErrAlreadyResponded
		}
		if rc.state.CompareAndSwap(old, old|rcResponded) {
			break
		}
	}
	var err error
	if resp != nil {
		if err = rc.conn.checkBacklog(rc.req, resp); err == nil {
			err = rc.conn.Conn.writeResponse(rc.req, resp)
		}
	}
	if old&rcDeferred != 0 {
		rc.conn.Conn.handling.Add(-1)
	}
	return err
}

// backlogCheckBody is the body size from which a response first checks the
// bytes its connection's socket holds unsent or unacknowledged (a system
// call): large responses (pulls) are what a peer that does not read piles
// up; small ones are bounded by the write queue once the socket is full.
const backlogCheckBody = 1 << 10

// checkBacklog closes sc with ErrWriteQueueBytes when resp, answering req,
// would take its output over WithMaxQueuedBytes, counting the bytes its
// socket has taken but the peer not yet acknowledged as well as those
// queued. The kernel's send buffer can grow to megabytes per connection:
// counting only the queue, a peer that does not read would be cut only
// after the broker produced that much for it. As with the queue alone, a
// response is always accepted when nothing is backed up.
func (sc *ServerConn) checkBacklog(req, resp *protocol.Command) error {
	c := sc.Conn
	lim := c.cfg.maxQueuedB
	if c.sock == nil || lim <= 0 || len(resp.Body) < backlogCheckBody || req.IsOneway() {
		return nil
	}
	backlog := c.queuedB.Load() + int64(c.sock.unsent())
	if backlog == 0 || backlog+int64(len(resp.Body)) <= lim {
		return nil
	}
	c.logClose("remoting: closing connection: unread output over its byte bound", "bytes", backlog, "limit", lim)
	c.shutdown(ErrWriteQueueBytes)
	return c.closedErr()
}

// ServerConn is the server side of one accepted connection. It embeds *Conn,
// so the server can Invoke, InvokeAsync and InvokeOneway requests to the
// client (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, …) and watch
// Done; requests from the client go to the Server's processors. Per-connection
// values can be attached with SetValue. Safe for concurrent use.
//
// ServerConn.Close does not wait; the embedded Conn's own Close (sc.Conn.Close)
// waits for the connection's processors and must not be called from one.
type ServerConn struct {
	*Conn
	id   uint64
	vals struct {
		sync.Mutex
		m map[any]any
	}
}

// ID returns a number unique among the connections of this Server.
func (sc *ServerConn) ID() uint64 { return sc.id }

// SetValue attaches v to the connection under key (nil v removes it).
func (sc *ServerConn) SetValue(key, v any) {
	sc.vals.Lock()
	defer sc.vals.Unlock()
	if v == nil {
		delete(sc.vals.m, key)
		return
	}
	if sc.vals.m == nil {
		sc.vals.m = make(map[any]any)
	}
	sc.vals.m[key] = v
}

// Value returns the value attached under key, or nil.
func (sc *ServerConn) Value(key any) any {
	sc.vals.Lock()
	defer sc.vals.Unlock()
	return sc.vals.m[key]
}

// Close closes the connection without waiting: pending calls to the client
// fail, running processors see their ctx cancelled, and the Server joins the
// connection's goroutines (and calls OnDisconnect) in the background. It is
// safe to call from a processor. Idempotent; returns nil.
func (sc *ServerConn) Close() error {
	sc.Conn.shutdown(errLocalClose)
	return nil
}

// ServerStats is a snapshot of a Server's counters. The counters after
// Active count, since start, the connections refused or closed for a limit;
// each kind is also logged, at most once per WithLimitLogInterval.
type ServerStats struct {
	Accepted int64 // connections accepted and served since start (refused ones excluded)
	Active   int64 // connections open now (past their TLS handshake)

	RejectedConns      int64 // closed at accept: WithMaxConns connections were open
	RejectedConnsPerIP int64 // closed at accept: WithMaxConnsPerIP connections from its IP were open
	FirstFrameTimeouts int64 // closed: no TLS handshake and complete frame within WithFirstFrameTimeout
	IdleTimeouts       int64 // closed: no complete frame within WithIdleTimeout
	WriteQueueFull     int64 // closed: a response found the write queue full (WithWriteQueueFrames)
	WriteQueueBytes    int64 // closed: a response would exceed WithMaxQueuedBytes
	WriteTimeouts      int64 // closed: a socket write did not finish within WithWriteTimeout
	OversizedFrames    int64 // closed: a frame's length word exceeded WithMaxFrameSize
	MalformedFrames    int64 // closed: a frame could not be decoded (oversized ones excluded)

	UnencodableResponses int64 // a processor's response could not be encoded (SYSTEM_ERROR sent instead)
	ProcessorPanics      int64 // a processor panicked (answered SYSTEM_ERROR)

	PacedAccepts int64 // accepts held back to keep to WithMaxConnRate
}

// limitKind names a limit whose hits a Server counts and logs.
type limitKind int

const (
	limitConns limitKind = iota
	limitConnsPerIP
	limitFirstFrame
	limitIdle
	limitQueueFrames
	limitQueueBytes
	limitWriteTimeout
	limitFrameSize
	limitMalformed
	limitUnencodable
	limitPanic
	limitConnRate
	numLimits
)

// limitMessages are the log messages of the limits.
var limitMessages = [numLimits]string{
	limitConns:        "remoting: connection refused: too many connections",
	limitConnsPerIP:   "remoting: connection refused: too many connections from one IP address",
	limitFirstFrame:   "remoting: connection closed: no complete first frame in time",
	limitIdle:         "remoting: connection closed: idle",
	limitQueueFrames:  "remoting: connection closed: write queue full (peer not reading)",
	limitQueueBytes:   "remoting: connection closed: queued output over its byte bound (peer not reading)",
	limitWriteTimeout: "remoting: connection closed: write timed out (peer not reading)",
	limitFrameSize:    "remoting: connection closed: frame larger than the maximum frame size",
	limitMalformed:    "remoting: connection closed: malformed frame",
	limitUnencodable:  "remoting: response not encodable; answered SYSTEM_ERROR",
	limitPanic:        "remoting: processor panicked; answered SYSTEM_ERROR",
	limitConnRate:     "remoting: accepts paced: new connections over the creation rate",
}

// limitCounter counts the hits of one limit and rate-limits their logging.
type limitCounter struct {
	hits    atomic.Int64
	logged  atomic.Int64 // hits when last logged
	lastLog atomic.Int64 // unix nanoseconds of the last log line; 0 = never
}

// Server serves RocketMQ remoting requests: one Processor per request code,
// many multiplexed connections, each with the machinery of Conn (bounded
// write queue, bounded processor concurrency, idle timeout, max frame size).
// A connection that sends a malformed or oversized frame, idles too long or
// does not read its responses is closed; the Server keeps serving the rest.
//
// Handle, Control and the other methods are safe for concurrent use,
// including while serving.
type Server struct {
	cfg serverConfig
	log *slog.Logger

	procMu sync.Mutex // serialises Handle
	procs  atomic.Pointer[map[int32]procEntry]

	ctrl controls

	ctx    context.Context // parent of every connection's lifetime ctx
	cancel context.CancelFunc
	quit   chan struct{} // closed when Shutdown or Close begins
	going  atomic.Bool   // Shutdown began: GO_AWAY to new clients

	mu struct {
		sync.Mutex
		closed    bool // no new listeners or connections
		listeners map[net.Listener]struct{}
		conns     map[*ServerConn]struct{}
		addr      net.Addr
		serveErr  error
		nextID    uint64
		open      int                // connections being served, handshaking included
		perIP     map[netip.Addr]int // open per remote IP
	}
	wg sync.WaitGroup

	accepted atomic.Int64
	limits   [numLimits]limitCounter
}

// NewServer returns a Server configured by opts; it serves nothing until
// Serve or Listen.
func NewServer(opts ...ServerOption) (*Server, error) {
	cfg := defaultServerConfig()
	for _, o := range opts {
		o.applyServer(&cfg)
	}
	if !cfg.conn.languageIsSet {
		cfg.conn.language = protocol.LanguageJava
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.permissive && cfg.conn.tls == nil {
		return nil, errors.New("remoting: WithPermissiveTLS needs WithTLSConfig")
	}
	s := &Server{cfg: cfg, log: cfg.conn.logger, quit: make(chan struct{})}
	// Connection-level events of every connection are counted and logged
	// through the Server's rate limit.
	s.cfg.conn.limitHit = s.limitHit
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mu.listeners = make(map[net.Listener]struct{})
	s.mu.conns = make(map[*ServerConn]struct{})
	s.mu.perIP = make(map[netip.Addr]int)
	empty := map[int32]procEntry{}
	s.procs.Store(&empty)
	return s, nil
}

// procEntry is one registered processor.
type procEntry struct {
	p      Processor
	inline bool // HandleInline: runs on the connection's reader goroutine
}

// Handle registers p for requests with the given code, replacing an earlier
// registration. A nil p removes it. Requests whose code has no processor are
// answered REQUEST_CODE_NOT_SUPPORTED with Java's remark.
func (s *Server) Handle(code int32, p Processor) {
	s.handle(code, procEntry{p: p})
}

// HandleInline is Handle for a processor that runs on the reader goroutine
// of the request's connection instead of a handler goroutine, sparing the
// hand-off (a channel send and a goroutine wake-up) per request. It suits
// processors that only parse, enqueue and return, deferring their answer
// (rc.Defer) to whoever completes the work, as the broker's send path does.
//
// While p runs, no further frame of that connection is read: p must not
// wait for anything that needs another request of the same connection,
// and any wait it does (a full queue) throttles that connection only. p
// needs no handler slot (WithMaxConcurrentHandlers). Interceptors run
// inline too. While fault-injection controls (Control, KeepControl) are
// registered, requests go to handler goroutines as with Handle, since
// controls may block.
func (s *Server) HandleInline(code int32, p Processor) {
	s.handle(code, procEntry{p: p, inline: true})
}

func (s *Server) handle(code int32, e procEntry) {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	old := *s.procs.Load()
	m := make(map[int32]procEntry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if e.p == nil {
		delete(m, code)
	} else {
		m[code] = e
	}
	s.procs.Store(&m)
}

// Listen binds a TCP listener to addr ("host:port"; port 0 picks a free
// one), serves it on a goroutine the Server owns, and returns the bound
// address. ctx bounds the bind only. An accept failure that stops that
// goroutine is logged and returned by Close or Shutdown.
func (s *Server) Listen(ctx context.Context, addr string) (net.Addr, error) {
	lc := s.ListenConfig()
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("remoting: listen %s: %w", addr, err)
	}
	if !s.trackListener(l) {
		return nil, ErrServerClosed
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.serve(l); !errors.Is(err, ErrServerClosed) {
			s.log.Error("remoting: server stopped accepting", "addr", l.Addr().String(), "err", err)
			s.mu.Lock()
			s.mu.serveErr = errors.Join(s.mu.serveErr, err)
			s.mu.Unlock()
		}
	}()
	return l.Addr(), nil
}

// ListenConfig returns the configuration Listen binds with, for a caller
// that binds its listener itself and passes it to Serve. With an idle
// timeout (WithIdleTimeout) its accepted connections have no TCP
// keep-alive, which would otherwise be Go's default: the idle timeout
// closes a vanished peer's connection first (the keep-alive's probes
// find it after 15 s + 9 x 15 s), and setting it up costs four system
// calls per connection, accepted or refused, which a flood of dials
// multiplies.
func (s *Server) ListenConfig() net.ListenConfig {
	var lc net.ListenConfig
	if s.cfg.conn.idleTimeout > 0 {
		lc.KeepAlive = -1
	}
	return lc
}

// Addr returns the address of the most recently started listener, or nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.addr
}

// Stats returns a snapshot of the Server's counters.
func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	active := int64(len(s.mu.conns))
	s.mu.Unlock()
	return ServerStats{
		Accepted:           s.accepted.Load(),
		Active:             active,
		RejectedConns:      s.limits[limitConns].hits.Load(),
		RejectedConnsPerIP: s.limits[limitConnsPerIP].hits.Load(),
		FirstFrameTimeouts: s.limits[limitFirstFrame].hits.Load(),
		IdleTimeouts:       s.limits[limitIdle].hits.Load(),
		WriteQueueFull:     s.limits[limitQueueFrames].hits.Load(),
		WriteQueueBytes:    s.limits[limitQueueBytes].hits.Load(),
		WriteTimeouts:      s.limits[limitWriteTimeout].hits.Load(),
		OversizedFrames:    s.limits[limitFrameSize].hits.Load(),
		MalformedFrames:    s.limits[limitMalformed].hits.Load(),

		UnencodableResponses: s.limits[limitUnencodable].hits.Load(),
		ProcessorPanics:      s.limits[limitPanic].hits.Load(),

		PacedAccepts: s.limits[limitConnRate].hits.Load(),
	}
}

// limitHit counts a hit of limit k and logs it unless a hit of k was
// logged less than the log interval ago; the line then says how many hits
// there were since the previous one.
func (s *Server) limitHit(k limitKind, remote net.Addr, args ...any) {
	lc := &s.limits[k]
	n := lc.hits.Add(1)
	now := time.Now().UnixNano()
	last := lc.lastLog.Load()
	if last != 0 && now-last < int64(s.cfg.limitLog) {
		return
	}
	if !lc.lastLog.CompareAndSwap(last, now) {
		return // another goroutine logs this interval
	}
	lvl := slog.LevelWarn
	switch k {
	case limitIdle:
		lvl = slog.LevelInfo // clients that went away: routine
	case limitPanic:
		lvl = slog.LevelError
	}
	args = append(args, "remote", addrString(remote), "since_last_log", n-lc.logged.Swap(n), "total", n)
	s.log.Log(context.Background(), lvl, limitMessages[k], args...)
}

func addrString(a net.Addr) string {
	if a == nil {
		return "<unknown>"
	}
	return a.String()
}

// remoteIP returns the IP address of a TCP peer (IPv4-mapped addresses
// unmapped), or the zero Addr for other kinds of peers.
func remoteIP(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Addr{}
	}
	return ip.Unmap()
}

// Conns returns a snapshot of the open connections.
func (s *Server) Conns() []*ServerConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*ServerConn, 0, len(s.mu.conns))
	for sc := range s.mu.conns {
		out = append(out, sc)
	}
	return out
}

func (s *Server) trackListener(l net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		_ = l.Close() // never served
		return false
	}
	s.mu.listeners[l] = struct{}{}
	s.mu.addr = l.Addr()
	return true
}

// Serve accepts connections on l and serves them until Shutdown or Close,
// then returns ErrServerClosed; it returns another error only if Accept
// fails permanently. Serve always closes l. It blocks; call it on a
// goroutine of your own (or use Listen).
func (s *Server) Serve(l net.Listener) error {
	if !s.trackListener(l) {
		return ErrServerClosed
	}
	return s.serve(l)
}

func (s *Server) serve(l net.Listener) error {
	defer func() {
		s.mu.Lock()
		delete(s.mu.listeners, l)
		s.mu.Unlock()
		_ = l.Close() // may already be closed by Close
	}()
	var delay time.Duration
	var pace acceptPacer
	if r := s.cfg.connRate; r > 0 {
		pace.interval = time.Second / time.Duration(r)
		pace.slack = time.Duration(s.cfg.connBurst) * pace.interval
	}
	for {
		nc, err := l.Accept()
		if err != nil {
			select {
			case <-s.quit:
				return ErrServerClosed
			default:
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				// Out of file descriptors and the like: back off, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("remoting: accept failed; retrying", "err", err, "delay", delay)
				if !s.pause(delay) {
					return ErrServerClosed
				}
				continue
			}
			return fmt.Errorf("remoting: accept: %w", err)
		}
		delay = 0
		if !s.startConn(nc) {
			return ErrServerClosed
		}
		if d := pace.next(time.Now()); d > 0 {
			// Over the creation rate: the next connection waits in the
			// listen backlog. Connections already open meanwhile get the
			// cores rather than a burst of new ones (handshakes, first
			// frames, goroutines) ahead of them in the run queues.
			s.limitHit(limitConnRate, nc.RemoteAddr(), "rate", s.cfg.connRate, "burst", s.cfg.connBurst)
			if !s.pause(d) {
				return ErrServerClosed
			}
		}
	}
}

// pause waits d on the accept loop; false if the Server closed meanwhile.
func (s *Server) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.quit:
		return false
	}
}

// acceptPacer spaces accepts to one per interval on average, letting
// slack/interval of them through back to back (a token bucket in its
// virtual-time form, GCRA). The zero value, and a zero interval, never
// waits. It belongs to one accept loop: no locking.
type acceptPacer struct {
	interval time.Duration
	slack    time.Duration // burst × interval
	tat      time.Time     // theoretical arrival time of the next accept
}

// next records an accept at now and returns how long to wait before the
// following one.
func (p *acceptPacer) next(now time.Time) time.Duration {
	if p.interval <= 0 {
		return 0
	}
	if p.tat.Before(now) {
		p.tat = now
	}
	p.tat = p.tat.Add(p.interval)
	return max(p.tat.Sub(now)-p.slack, 0)
}

// startConn serves nc on a new goroutine, or closes it at once when the
// Server is closed (it then returns false) or a connection limit is reached.
func (s *Server) startConn(nc net.Conn) bool {
	ip := remoteIP(nc.RemoteAddr())
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		_ = nc.Close() // never served
		return false
	}
	var refuse limitKind = -1
	switch {
	case s.cfg.maxConns > 0 && s.mu.open >= s.cfg.maxConns:
		refuse = limitConns
	case s.cfg.maxConnsIP > 0 && ip.IsValid() && s.mu.perIP[ip] >= s.cfg.maxConnsIP:
		refuse = limitConnsPerIP
	}
	if refuse >= 0 {
		s.mu.Unlock()
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // reset: no TIME_WAIT left behind by a flood
		}
		_ = nc.Close() // refused; nothing was read
		limit := s.cfg.maxConns
		if refuse == limitConnsPerIP {
			limit = s.cfg.maxConnsIP
		}
		s.limitHit(refuse, nc.RemoteAddr(), "limit", limit)
		return true
	}
	s.mu.open++
	if ip.IsValid() {
		s.mu.perIP[ip]++
	}
	s.accepted.Add(1)
	s.mu.nextID++
	id := s.mu.nextID
	s.wg.Add(1)
	go s.serveConn(nc, id, ip)
	s.mu.Unlock()
	return true
}

// release forgets a connection counted by startConn.
func (s *Server) release(ip netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.open--
	if ip.IsValid() {
		if s.mu.perIP[ip] <= 1 {
			delete(s.mu.perIP, ip)
		} else {
			s.mu.perIP[ip]--
		}
	}
}

// handshakeTimeout bounds a TLS handshake or the permissive-mode sniff.
const handshakeTimeout = 10 * time.Second

// prepare applies TLS to an accepted connection.
func (s *Server) prepare(nc net.Conn) (net.Conn, error) {
	cfg := s.cfg.conn.tls
	if cfg == nil {
		return nc, nil
	}
	d := handshakeTimeout
	if it := s.cfg.conn.idleTimeout; it > 0 && it < d {
		d = it
	}
	if ff := s.cfg.firstFrame; ff > 0 && ff < d {
		d = ff
	}
	ctx, cancel := context.WithTimeout(s.ctx, d)
	defer cancel()
	if s.cfg.permissive {
		_ = nc.SetReadDeadline(time.Now().Add(d)) // a failure surfaces in Peek
		br := bufio.NewReaderSize(nc, 16)
		first, err := br.Peek(1)
		if err != nil {
			return nil, fmt.Errorf("remoting: sniffing first byte: %w", err)
		}
		_ = nc.SetReadDeadline(time.Time{}) // the reader sets its own deadlines
		pc := &peekedConn{Conn: nc, r: br}
		if first[0] != 0x16 { // not a TLS handshake record: plain TCP
			return pc, nil
		}
		nc = pc
	}
	tc := tls.Server(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("remoting: TLS handshake: %w", err)
	}
	return tc, nil
}

// peekedConn is a net.Conn whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// serveConn runs one accepted connection: its reader runs here; its writer
// and processors on goroutines joined before OnDisconnect.
func (s *Server) serveConn(nc net.Conn, id uint64, ip netip.Addr) {
	defer s.wg.Done()
	defer s.release(ip)
	accepted := time.Now()
	raw := nc
	nc, err := s.prepare(raw)
	if err != nil {
		s.log.Debug("remoting: dropping connection", "remote", raw.RemoteAddr().String(), "err", err)
		_ = raw.Close() // handshake failed; nothing was served
		if isTimeout(err) {
			s.limitHit(limitFirstFrame, raw.RemoteAddr(), "timeout", s.cfg.firstFrame, "in", "TLS handshake")
		}
		return
	}
	sc := &ServerConn{id: id}
	sc.Conn = newConn(s.ctx, nc, s.cfg.conn)
	sc.Conn.dispatch = func(ctx context.Context, req *protocol.Command) { s.serveRequest(ctx, sc, req) }
	sc.Conn.inline = func(req *protocol.Command) bool { return s.serveInline(sc, req) }
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		_ = nc.Close() // closed while handshaking
		return
	}
	s.mu.conns[sc] = struct{}{}
	s.mu.Unlock()

	if s.cfg.onConnect != nil {
		s.cfg.onConnect(sc)
	}
	stopFirst := s.firstFrameDeadline(sc, accepted)
	rerr := sc.Conn.readLoop()
	sc.Conn.shutdown(rerr)
	stopFirst()
	sc.Conn.wg.Wait()
	s.countClose(sc, rerr)

	s.mu.Lock()
	delete(s.mu.conns, sc)
	s.mu.Unlock()
	if s.cfg.onDisconnect != nil {
		s.cfg.onDisconnect(sc)
	}
}

// firstFrameDeadline closes sc with ErrFirstFrameTimeout unless it has
// read a complete frame by the first-frame timeout after accepted. The
// returned func cancels the check and waits for it if it started.
func (s *Server) firstFrameDeadline(sc *ServerConn, accepted time.Time) (stop func()) {
	if s.cfg.firstFrame <= 0 {
		return func() {}
	}
	fired := make(chan struct{})
	t := time.AfterFunc(time.Until(accepted.Add(s.cfg.firstFrame)), func() {
		defer close(fired)
		if sc.Conn.framesIn.Load() == 0 {
			sc.Conn.shutdown(ErrFirstFrameTimeout)
		}
	})
	return func() {
		if !t.Stop() {
			<-fired
		}
	}
}

// countClose counts (and logs, rate-limited) a connection closed by one of
// the limits. rerr is what its read loop returned: when that is the close
// cause and a timeout, the idle timeout closed it; another timeout cause is
// the writer's.
func (s *Server) countClose(sc *ServerConn, rerr error) {
	var ce *closedError
	if !errors.As(sc.Err(), &ce) || ce.cause == nil {
		return
	}
	cause := ce.cause
	var args []any
	var k limitKind
	switch {
	case errors.Is(cause, ErrFirstFrameTimeout):
		k, args = limitFirstFrame, []any{"timeout", s.cfg.firstFrame}
	case errors.Is(cause, ErrWriteQueueBytes):
		k, args = limitQueueBytes, []any{"limit_bytes", s.cfg.conn.maxQueuedB}
	case errors.Is(cause, ErrWriteQueueFull):
		k, args = limitQueueFrames, []any{"limit_frames", s.cfg.conn.writeQueue}
	case errors.Is(cause, protocol.ErrFrameTooLarge):
		k, args = limitFrameSize, []any{"limit_bytes", s.cfg.conn.maxFrame}
	case errors.Is(cause, protocol.ErrMalformedFrame):
		k, args = limitMalformed, []any{"err", cause}
	case cause == rerr && isTimeout(cause):
		k, args = limitIdle, []any{"timeout", s.cfg.conn.idleTimeout}
	case cause != rerr && isTimeout(cause):
		k, args = limitWriteTimeout, []any{"timeout", s.cfg.conn.writeTimeout}
	default:
		return
	}
	s.limitHit(k, sc.RemoteAddr(), args...)
}

// cutForOutput reports whether c is closed because its peer did not read
// its output (ErrWriteQueueBytes, ErrWriteQueueFull). It does not block.
func cutForOutput(c *Conn) bool {
	select {
	case <-c.quit:
	default:
		return false
	}
	err := c.Err()
	return errors.Is(err, ErrWriteQueueBytes) || errors.Is(err, ErrWriteQueueFull)
}

// serveInline serves req on the reader goroutine if its processor was
// registered with HandleInline and no control is registered, and reports
// whether it did.
func (s *Server) serveInline(sc *ServerConn, req *protocol.Command) bool {
	if !(*s.procs.Load())[req.Code].inline || s.ctrl.n.Load() > 0 {
		return false
	}
	s.serveRequest(sc.Conn.ctx, sc, req)
	return true
}

// serveRequest runs one request through the controls and its processor.
func (s *Server) serveRequest(ctx context.Context, sc *ServerConn, req *protocol.Command) {
	c := sc.Conn
	if !req.IsOneway() && cutForOutput(c) {
		// The peer was cut for not reading its responses: no answer can
		// reach it. Requests it had sent before are skipped rather than
		// served for nothing (a pull reads and encodes its messages
		// first); handler goroutines already queued would otherwise keep
		// the cores busy long after the cut.
		return
	}
	c.handling.Add(1)
	rc := &RequestCtx{req: req, conn: sc}
	resp, err := s.process(ctx, rc)
	if err != nil {
		resp = errorResponse(req, err)
	}
	if resp != nil {
		_ = rc.Respond(resp) // a failure closed the connection, which reports it
	}
	if rc.state.Load()&rcDeferred == 0 {
		c.handling.Add(-1)
	}
}

func (s *Server) process(ctx context.Context, rc *RequestCtx) (resp *protocol.Command, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.limitHit(limitPanic, rc.conn.remote, "code", rc.req.Code, "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, fmt.Errorf("remoting: processor panic: %v", r)
		}
	}()
	req := rc.req
	if s.going.Load() && req.Version > 475 {
		// Java's answer while shutting down, to clients that understand it.
		return protocol.NewResponse(req, protocol.ResGoAway, "please go away"), nil
	}
	for _, ic := range s.cfg.interceptors {
		if resp, handled := ic(ctx, rc); handled {
			return resp, nil
		}
	}
	if s.ctrl.n.Load() > 0 {
		if resp, err, handled := s.ctrl.run(rc); handled {
			return resp, err
		}
	}
	e := (*s.procs.Load())[req.Code]
	if e.p == nil {
		return notSupported(req), nil
	}
	return e.p.ProcessRequest(ctx, rc)
}

// errorResponse turns a processor error into a response: the code of a
// *protocol.Error in err's chain, or SYSTEM_ERROR. The remark is the
// *protocol.Error's remark when it has one, else err's text.
func errorResponse(req *protocol.Command, err error) *protocol.Command {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		remark := pe.Remark
		if remark == "" {
			remark = err.Error()
		}
		return protocol.NewResponse(req, pe.Code, remark)
	}
	return protocol.NewResponse(req, protocol.ResSystemError, err.Error())
}

// Shutdown stops the Server gracefully: it stops accepting, answers new
// requests from clients newer than 5.3.1 with GO_AWAY (others are still
// served), waits for every connection's processors to return and its
// deferred responses to be sent and flushed, closing each connection as it
// drains, and then closes. When ctx ends first it closes everything at once
// and returns ctx's error. Later calls, and Serve, return ErrServerClosed.
func (s *Server) Shutdown(ctx context.Context) error {
	if !s.beginClose() {
		return s.Close()
	}
	s.going.Store(true)
	poll := time.Millisecond
	t := time.NewTimer(poll)
	defer t.Stop()
	for !s.closeDrained() {
		select {
		case <-ctx.Done():
			_ = s.Close() // the deadline error is the one to report
			return ctx.Err()
		case <-t.C:
		}
		poll = min(2*poll, 50*time.Millisecond)
		t.Reset(poll)
	}
	return s.Close()
}

// beginClose stops accepting. It reports whether this call did it.
func (s *Server) beginClose() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return false
	}
	s.mu.closed = true
	close(s.quit)
	for l := range s.mu.listeners {
		_ = l.Close() // unblocks Accept; serve reports ErrServerClosed
	}
	return true
}

// closeDrained closes every connection with nothing in flight and reports
// whether none is left open.
func (s *Server) closeDrained() bool {
	open := 0
	for _, sc := range s.Conns() {
		c := sc.Conn
		select {
		case <-c.quit:
			continue
		default:
		}
		if c.handling.Load() == 0 && c.queued.Load() == 0 {
			c.shutdown(ErrServerClosed)
			continue
		}
		open++
	}
	return open == 0
}

// Close closes the Server at once: listeners, then every connection (pending
// calls to clients fail, processors see their ctx cancelled, deferred
// requests are abandoned). It waits for every goroutine the Server started,
// including processors and OnDisconnect calls, so it must not be called from
// a processor. Idempotent; it returns the error that stopped a Listen
// goroutine's accepting, if any.
func (s *Server) Close() error {
	s.beginClose()
	// No connection registers once closed is set, so this snapshot is all.
	for _, sc := range s.Conns() {
		sc.Conn.shutdown(ErrServerClosed)
	}
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.serveErr
}
