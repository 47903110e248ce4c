package remoting

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Defaults of the options below.
const (
	// DefaultIdleTimeout is how long a connection may go without receiving a
	// complete frame before it is closed: RocketMQ's 120 s
	// (serverChannelMaxIdleTimeSeconds, and the Go client's read timeout).
	DefaultIdleTimeout = 120 * time.Second
	// DefaultWriteTimeout bounds one buffered write to the socket. A peer that
	// stops reading for this long gets its connection closed.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultMaxInFlightAsync bounds a Conn's concurrent InvokeAsync calls
	// (RocketMQ's clientAsyncSemaphoreValue).
	DefaultMaxInFlightAsync = 65535
	// DefaultMaxInFlightOneway bounds a Conn's oneway requests queued but not
	// yet written (RocketMQ's clientOnewaySemaphoreValue).
	DefaultMaxInFlightOneway = 65535
	// DefaultWriteQueueFrames is the capacity, in frames, of a connection's
	// write queue.
	DefaultWriteQueueFrames = 4096
	// DefaultClientHandlers bounds the goroutines a Conn runs its
	// RequestHandler on at once.
	DefaultClientHandlers = 64
	// DefaultServerHandlers bounds the goroutines a Server runs processors on
	// at once for ONE connection.
	DefaultServerHandlers = 256
	// DefaultMaxQueuedBytes bounds the bytes of the frames a connection has
	// queued but not yet handed to the socket (the write queue's bound in
	// bytes; DefaultWriteQueueFrames bounds it in frames): 32 MiB, room for
	// more than a hundred full pull responses.
	DefaultMaxQueuedBytes = 32 << 20
	// DefaultMaxConns bounds the connections a Server keeps open at once.
	DefaultMaxConns = 10000
	// DefaultMaxConnsPerIP bounds the connections a Server keeps open at
	// once from one remote IP address.
	DefaultMaxConnsPerIP = 1000
	// DefaultFirstFrameTimeout is how long an accepted connection may take
	// to complete its TLS handshake (if any) and its first frame. Clients
	// send a request as soon as they connect; a connection that stays
	// silent, or trickles bytes, holds a socket and two buffers for nothing.
	DefaultFirstFrameTimeout = 10 * time.Second
	// DefaultLimitLogInterval is how often a Server logs, per kind of limit,
	// the connections it refused or closed for that limit.
	DefaultLimitLogInterval = 10 * time.Second
)

// Option configures Dial and NewConn. Options that also configure a Server
// are CommonOptions.
type Option interface{ apply(*connConfig) }

// ServerOption configures NewServer. CommonOptions are ServerOptions too;
// for a Server they configure every connection it accepts.
type ServerOption interface{ applyServer(*serverConfig) }

// CommonOption configures both a Conn (Dial, NewConn) and a Server.
type CommonOption interface {
	Option
	ServerOption
}

type connOpt func(*connConfig)

func (o connOpt) apply(c *connConfig) { o(c) }

type serverOpt func(*serverConfig)

func (o serverOpt) applyServer(c *serverConfig) { o(c) }

type commonOpt func(*connConfig)

func (o commonOpt) apply(c *connConfig)         { o(c) }
func (o commonOpt) applyServer(c *serverConfig) { o(&c.conn) }

// orDiscard returns l, or a logger that discards when l is nil.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// connConfig is the configuration of one connection, client or server side.
type connConfig struct {
	logger    *slog.Logger
	tls       *tls.Config
	serialize protocol.SerializeType
	// serializeSet: WithSerializeType was given, so responses too are
	// written in serialize, not in the encoding of their request.
	serializeSet  bool
	maxFrame      int
	idleTimeout   time.Duration
	writeTimeout  time.Duration
	writeQueue    int
	handlers      int
	language      protocol.LanguageCode
	version       int32
	hooks         []Hook
	maxAsync      int
	maxOneway     int
	maxQueuedB    int64
	handler       RequestHandler
	languageIsSet bool
	// limitHit, set for a Server's connections, counts and logs
	// (rate-limited) connection-level events; a Conn of its own logs them
	// itself.
	limitHit func(k limitKind, remote net.Addr, args ...any)
	// noSock (tests and benchmarks only) treats a TCP connection as any
	// other: every frame goes through the writer goroutine and the read
	// buffer is kept, as before direct writes existed.
	noSock bool
	// noCallerReads: WithCallerReads(false).
	noCallerReads bool
}

func defaultConnConfig() connConfig {
	return connConfig{
		serialize:    protocol.SerializeJSON,
		maxFrame:     protocol.DefaultMaxFrameSize,
		idleTimeout:  DefaultIdleTimeout,
		writeTimeout: DefaultWriteTimeout,
		writeQueue:   DefaultWriteQueueFrames,
		handlers:     DefaultClientHandlers,
		language:     protocol.LanguageGo,
		version:      protocol.CurrentVersion,
		maxAsync:     DefaultMaxInFlightAsync,
		maxOneway:    DefaultMaxInFlightOneway,
		maxQueuedB:   DefaultMaxQueuedBytes,
	}
}

func (c *connConfig) validate() error {
	switch {
	case c.serialize != protocol.SerializeJSON && c.serialize != protocol.SerializeRocketMQ:
		return fmt.Errorf("remoting: unknown serialize type %d", c.serialize)
	case c.maxFrame < 64 || c.maxFrame > 1<<30:
		return fmt.Errorf("remoting: max frame size %d outside [64, 1 GiB]", c.maxFrame)
	case c.idleTimeout < 0:
		return fmt.Errorf("remoting: negative idle timeout %v", c.idleTimeout)
	case c.writeTimeout < 0:
		return fmt.Errorf("remoting: negative write timeout %v", c.writeTimeout)
	case c.writeQueue < 1:
		return fmt.Errorf("remoting: write queue of %d frames", c.writeQueue)
	case c.handlers < 1:
		return fmt.Errorf("remoting: %d concurrent handlers", c.handlers)
	case c.maxAsync < 1:
		return fmt.Errorf("remoting: max in-flight async %d", c.maxAsync)
	case c.maxOneway < 1:
		return fmt.Errorf("remoting: max in-flight oneway %d", c.maxOneway)
	case c.maxQueuedB < 0:
		return fmt.Errorf("remoting: max queued bytes %d", c.maxQueuedB)
	case c.version < -1<<15 || c.version >= 1<<15:
		return fmt.Errorf("remoting: version %d outside int16", c.version)
	}
	c.logger = orDiscard(c.logger)
	return nil
}

// WithLogger sets the logger; nil (the default) discards. Connection-level
// events (closes and their reasons, malformed frames, rejected requests) are
// logged at Debug or Warn. A Server counts the events caused by its peers
// (ServerStats) and logs each kind at most once per WithLimitLogInterval,
// so that many misbehaving connections cannot flood the log.
func WithLogger(l *slog.Logger) CommonOption {
	return commonOpt(func(c *connConfig) { c.logger = l })
}

// WithTLSConfig enables TLS. For Dial, cfg is the client configuration (nil
// ServerName is derived from the address by crypto/tls); for a Server, it is
// the server configuration and every accepted connection must speak TLS
// unless WithPermissiveTLS is also given. NewConn ignores it (the net.Conn
// given is used as is).
func WithTLSConfig(cfg *tls.Config) CommonOption {
	return commonOpt(func(c *connConfig) { c.tls = cfg })
}

// WithSerializeType sets the header encoding of every frame this side
// writes, requests and responses: protocol.SerializeJSON or
// protocol.SerializeRocketMQ, as a Java process started with
// -Drocketmq.serialize.type does. Without it, requests are written in JSON
// (the default of RocketMQ clients and servers) and each response in the
// encoding of the request it answers. Incoming frames are decoded in
// whichever encoding each one announces, as RocketMQ's Java and Go peers
// do. A frame the binary encoding cannot carry (a code outside int16, such
// as POP_MESSAGE's 200050) is written in JSON.
func WithSerializeType(st protocol.SerializeType) CommonOption {
	return commonOpt(func(c *connConfig) { c.serialize, c.serializeSet = st, true })
}

// WithMaxFrameSize bounds incoming frames (the value of the length word);
// protocol.DefaultMaxFrameSize (16 MiB) by default. A larger frame closes the
// connection before anything is allocated for it.
func WithMaxFrameSize(n int) CommonOption {
	return commonOpt(func(c *connConfig) { c.maxFrame = n })
}

// WithIdleTimeout sets how long a connection may wait for the next complete
// incoming frame before it is closed (DefaultIdleTimeout; 0 = never). The
// deadline restarts at frame boundaries (to save timer updates, only once it
// has aged by a sixteenth of the timeout, so the effective limit lies between
// 15/16 of the timeout and all of it); it therefore also bounds a peer that
// sends a frame byte by byte.
func WithIdleTimeout(d time.Duration) CommonOption {
	return commonOpt(func(c *connConfig) { c.idleTimeout = d })
}

// WithWriteTimeout bounds each buffered socket write (DefaultWriteTimeout;
// 0 = never). When it passes the connection is closed.
func WithWriteTimeout(d time.Duration) CommonOption {
	return commonOpt(func(c *connConfig) { c.writeTimeout = d })
}

// WithWriteQueueFrames sets the capacity, in frames, of each connection's
// write queue (DefaultWriteQueueFrames). Requests wait for room (bounded by
// their ctx); responses never wait: when the queue is full the connection is
// closed with ErrWriteQueueFull.
func WithWriteQueueFrames(n int) CommonOption {
	return commonOpt(func(c *connConfig) { c.writeQueue = n })
}

// WithMaxQueuedBytes bounds the bytes of the frames a connection has queued
// for its socket but not yet written (DefaultMaxQueuedBytes; 0 = no bound
// in bytes, the frame bound of WithWriteQueueFrames still applies). A
// response that would take the queue over it closes the connection with
// ErrWriteQueueBytes instead of buffering more for a peer that does not read
// (a single frame is always accepted into an empty queue, whatever its
// size). Requests this side sends count towards the bytes but wait only for
// frame room. On a Server's plain TCP connection (Linux), a response with a
// body of 1 KiB or more also counts the bytes the socket has taken but the
// peer not yet acknowledged: the kernel's send buffer, which grows to
// megabytes, does not hide a peer that stops reading.
func WithMaxQueuedBytes(n int64) CommonOption {
	return commonOpt(func(c *connConfig) { c.maxQueuedB = n })
}

// WithMaxConcurrentHandlers bounds how many incoming requests of one
// connection are handled at once, each on its own goroutine: a Conn's
// RequestHandler (DefaultClientHandlers) or a Server's processors
// (DefaultServerHandlers per connection). A request arriving when the bound
// is reached is answered at once with SYSTEM_BUSY (Java's "[OVERLOAD]" reply;
// dropped if oneway) so the reader never waits for a handler.
func WithMaxConcurrentHandlers(n int) CommonOption {
	return commonOpt(func(c *connConfig) { c.handlers = n })
}

// WithLanguage sets the language code stamped on outgoing commands whose
// Language is zero (LanguageJava). Conns default to protocol.LanguageGo,
// Servers to protocol.LanguageJava (so that Java clients see a Java broker).
func WithLanguage(l protocol.LanguageCode) CommonOption {
	return commonOpt(func(c *connConfig) { c.language, c.languageIsSet = l, true })
}

// WithVersion sets the version stamped on outgoing commands whose Version is
// zero; protocol.CurrentVersion by default.
func WithVersion(v int32) CommonOption {
	return commonOpt(func(c *connConfig) { c.version = v })
}

// WithHooks adds hooks: values implementing one or more of the Hook…
// interfaces. Hooks are called synchronously on the goroutine reading or
// writing the connection (its reader or writer goroutine, or a caller
// writing its request or reading its own response) and must be fast.
func WithHooks(hooks ...Hook) CommonOption {
	return commonOpt(func(c *connConfig) { c.hooks = append(c.hooks, hooks...) })
}

// WithMaxInFlightAsync bounds a Conn's InvokeAsync calls awaiting their
// response (DefaultMaxInFlightAsync). InvokeAsync waits for a slot, bounded
// by its ctx.
func WithMaxInFlightAsync(n int) Option {
	return connOpt(func(c *connConfig) { c.maxAsync = n })
}

// WithMaxInFlightOneway bounds a Conn's InvokeOneway requests queued but not
// yet written (DefaultMaxInFlightOneway). InvokeOneway waits for a slot,
// bounded by its ctx.
func WithMaxInFlightOneway(n int) Option {
	return connOpt(func(c *connConfig) { c.maxOneway = n })
}

// WithRequestHandler sets the handler of requests the peer sends to a Conn
// (server-initiated requests such as CHECK_TRANSACTION_STATE). Without one,
// such requests are answered with REQUEST_CODE_NOT_SUPPORTED.
func WithRequestHandler(h RequestHandler) Option {
	return connOpt(func(c *connConfig) { c.handler = h })
}

// WithCallerReads sets whether a sync call (Invoke, InvokeTimeout) may read
// its own response on the calling goroutine when nothing else is in
// flight on the connection, instead of waiting for the connection's reader
// goroutine to hand it over (on by default; plain TCP connections only).
// It spares each round trip the wake-up of another thread the hand-off
// costs. Meanwhile requests from the peer are read by that caller, or by
// the reader goroutine at most a millisecond after the last such call.
func WithCallerReads(on bool) Option {
	return connOpt(func(c *connConfig) { c.noCallerReads = !on })
}

// serverConfig is a Server's configuration.
type serverConfig struct {
	conn         connConfig
	maxConns     int
	maxConnsIP   int
	connRate     int // WithMaxConnRate: new connections per second; 0 = no pacing
	connBurst    int
	firstFrame   time.Duration
	limitLog     time.Duration
	permissive   bool
	interceptors []Interceptor
	onConnect    func(*ServerConn)
	onDisconnect func(*ServerConn)
}

func defaultServerConfig() serverConfig {
	cfg := serverConfig{
		conn:       defaultConnConfig(),
		maxConns:   DefaultMaxConns,
		maxConnsIP: DefaultMaxConnsPerIP,
		firstFrame: DefaultFirstFrameTimeout,
		limitLog:   DefaultLimitLogInterval,
	}
	cfg.conn.handlers = DefaultServerHandlers
	return cfg
}

func (c *serverConfig) validate() error {
	switch {
	case c.maxConns < 0:
		return fmt.Errorf("remoting: max connections %d", c.maxConns)
	case c.maxConnsIP < 0:
		return fmt.Errorf("remoting: max connections per IP %d", c.maxConnsIP)
	case c.connRate < 0 || c.connRate > 1_000_000 || c.connBurst < 0 || (c.connRate > 0) != (c.connBurst > 0):
		return fmt.Errorf("remoting: connection rate %d per second, burst %d: want 0 and 0 (no pacing), or a rate of 1 to 1,000,000 and a burst of at least 1", c.connRate, c.connBurst)
	case c.firstFrame < 0:
		return fmt.Errorf("remoting: negative first-frame timeout %v", c.firstFrame)
	case c.limitLog < 0:
		return fmt.Errorf("remoting: negative limit log interval %v", c.limitLog)
	}
	return c.conn.validate()
}

// WithMaxConns bounds the connections a Server keeps open at once
// (DefaultMaxConns; 0 = no bound). A connection accepted beyond it is
// closed at once, before anything is read from it or allocated for it, and
// counted in ServerStats.RejectedConns.
func WithMaxConns(n int) ServerOption {
	return serverOpt(func(c *serverConfig) { c.maxConns = n })
}

// WithMaxConnRate paces a Server's accepts to at most perSecond new
// connections per second on each listener, burst of them back to back
// (0, 0 = no pacing, the default). A connection beyond the rate waits in
// the listen backlog, its handshake done by the kernel, until the rate
// allows it: a storm of new connections (a flood, or every client of a
// restarted broker at once) then costs the Server its work spread over
// time, and the connections already open keep their latency. Accepts held
// back are counted in ServerStats.PacedAccepts and logged at most once per
// log interval. Connections refused by WithMaxConns count too. Bounds:
// perSecond up to 1,000,000, burst at least 1 when perSecond is set.
func WithMaxConnRate(perSecond, burst int) ServerOption {
	return serverOpt(func(c *serverConfig) { c.connRate, c.connBurst = perSecond, burst })
}

// WithMaxConnsPerIP bounds the connections a Server keeps open at once from
// one remote IP address (DefaultMaxConnsPerIP; 0 = no bound). A connection
// beyond it is closed at once and counted in ServerStats.RejectedConnsPerIP.
// Behind a NAT or a proxy many clients share an address: raise it there.
func WithMaxConnsPerIP(n int) ServerOption {
	return serverOpt(func(c *serverConfig) { c.maxConnsIP = n })
}

// WithFirstFrameTimeout sets how long an accepted connection may take, from
// accept, to finish its TLS handshake (if any) and deliver its first
// complete frame (DefaultFirstFrameTimeout; 0 = only the idle timeout
// applies). A connection that sends nothing, or trickles bytes without
// completing a frame, is closed when it passes and counted in
// ServerStats.FirstFrameTimeouts.
func WithFirstFrameTimeout(d time.Duration) ServerOption {
	return serverOpt(func(c *serverConfig) { c.firstFrame = d })
}

// WithLimitLogInterval sets how often a Server logs, per kind of limit (the
// fields of ServerStats), that connections were refused or closed for it
// (DefaultLimitLogInterval): the first event of an interval is logged with
// the number of events since the previous log line, the others are only
// counted. 0 logs every event.
func WithLimitLogInterval(d time.Duration) ServerOption {
	return serverOpt(func(c *serverConfig) { c.limitLog = d })
}

// WithPermissiveTLS makes a Server given WithTLSConfig accept both TLS and
// plain TCP on one port, telling them apart by the first byte (0x16 starts
// a TLS handshake; no valid plain frame starts with it), like Java's
// TlsMode.PERMISSIVE.
func WithPermissiveTLS() ServerOption {
	return serverOpt(func(c *serverConfig) { c.permissive = true })
}

// WithOnConnect sets a function called for every accepted connection before
// its first request is read, on that connection's goroutine. It may attach
// values with ServerConn.SetValue. It must not block for long.
func WithOnConnect(fn func(*ServerConn)) ServerOption {
	return serverOpt(func(c *serverConfig) { c.onConnect = fn })
}

// WithOnDisconnect sets a function called once for every accepted
// connection after it closed and its processors returned (ServerConn.Err
// tells why it closed). It runs on that connection's goroutine; Shutdown and
// Close wait for it.
func WithOnDisconnect(fn func(*ServerConn)) ServerOption {
	return serverOpt(func(c *serverConfig) { c.onDisconnect = fn })
}

// Interceptor inspects every request a Server receives before the fault
// injection controls and the processor of its code run, whether or not a
// processor is registered for the code (authentication and authorization
// use it so that no code escapes them). It returns handled=false to let the
// request go on, or handled=true with the response to send instead (nil
// sends nothing; a oneway request is never answered). It runs on the
// request's processor goroutine, must be safe for concurrent use and should
// not block for long; a panic is answered SYSTEM_ERROR, as a processor's is.
type Interceptor func(ctx context.Context, rc *RequestCtx) (resp *protocol.Command, handled bool)

// WithInterceptor adds an Interceptor to a Server. Interceptors run in the
// order given, after the GO_AWAY answer of a Server shutting down; the first
// that handles a request ends it. A nil fn is ignored.
func WithInterceptor(fn Interceptor) ServerOption {
	return serverOpt(func(c *serverConfig) {
		if fn != nil {
			c.interceptors = append(c.interceptors, fn)
		}
	})
}
