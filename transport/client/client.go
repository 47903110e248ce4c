package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Defaults of the client options.
const (
	// DefaultRequestTimeout bounds one request when the caller's ctx has no
	// deadline (RocketMQ's sendMsgTimeout, 3 s).
	DefaultRequestTimeout = 3 * time.Second
	// DefaultDialTimeout bounds one connection attempt.
	DefaultDialTimeout = 5 * time.Second
	// DefaultRouteRefresh is the period of the route refresh
	// (pollNameServerInterval).
	DefaultRouteRefresh = 30 * time.Second
	// DefaultHeartbeat is the period of heartbeats to brokers in use
	// (heartbeatBrokerInterval).
	DefaultHeartbeat = 30 * time.Second
	// DefaultResolverRefresh is how often name server addresses are fetched
	// again from an address service (RocketMQ clients: 2 min).
	DefaultResolverRefresh = 2 * time.Minute

	// maxDialBackoff caps the wait between connection attempts to one
	// address; minDialBackoff is the first wait after a failure.
	minDialBackoff = 50 * time.Millisecond
	maxDialBackoff = 2 * time.Second
	// maxResolverBody bounds an address-service answer.
	maxResolverBody = 64 << 10
)

// Option configures New. Options are validated by New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	nameServers     []string
	resolverURL     string
	resolverRefresh time.Duration
	httpClient      *http.Client
	instanceName    string
	creds           *Credentials
	tls             *tls.Config
	requestTimeout  time.Duration
	dialTimeout     time.Duration
	routeRefresh    time.Duration
	heartbeat       time.Duration
	logger          *slog.Logger
	remotingOpts    []remoting.Option
	headerEncoding  protocol.SerializeType
	clientIP        netip.Addr
	hooks           clientHooks // hooks.go
}

func defaultConfig() config {
	return config{
		resolverRefresh: DefaultResolverRefresh,
		requestTimeout:  DefaultRequestTimeout,
		dialTimeout:     DefaultDialTimeout,
		routeRefresh:    DefaultRouteRefresh,
		heartbeat:       DefaultHeartbeat,
		headerEncoding:  DefaultHeaderEncoding,
	}
}

func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	if len(c.nameServers) == 0 && c.resolverURL == "" {
		return bad("no name server: give WithNameServers or WithNameServerResolver")
	}
	for _, ns := range c.nameServers {
		if _, _, err := net.SplitHostPort(ns); err != nil {
			return bad("name server address %q: %v", ns, err)
		}
	}
	if c.resolverURL != "" {
		u, err := url.Parse(c.resolverURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("name server resolver URL %q must be http(s)://host/…", c.resolverURL)
		}
	}
	switch {
	case c.requestTimeout <= 0:
		return bad("request timeout %v", c.requestTimeout)
	case c.dialTimeout <= 0:
		return bad("dial timeout %v", c.dialTimeout)
	case c.routeRefresh < 10*time.Millisecond:
		return bad("route refresh interval %v below 10ms", c.routeRefresh)
	case c.heartbeat < 10*time.Millisecond:
		return bad("heartbeat interval %v below 10ms", c.heartbeat)
	case c.headerEncoding != protocol.SerializeJSON && c.headerEncoding != protocol.SerializeRocketMQ:
		return bad("unknown header encoding %d", c.headerEncoding)
	case c.resolverRefresh < 10*time.Millisecond:
		return bad("resolver refresh interval %v below 10ms", c.resolverRefresh)
	case strings.ContainsAny(c.instanceName, "@ \x01\x02"):
		return bad("instance name %q must not contain '@', spaces or separators", c.instanceName)
	}
	if c.creds != nil {
		if c.creds.AccessKey == "" || c.creds.SecretKey == "" {
			return bad("credentials need both an access key and a secret key")
		}
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.httpClient == nil {
		c.httpClient = &http.Client{Timeout: 10 * time.Second}
	}
	if !c.clientIP.IsValid() {
		c.clientIP = localIPv4()
	}
	if c.instanceName == "" {
		// Java's default: pid#nanoTime, so that two clients of one process
		// have different client ids.
		c.instanceName = strconv.Itoa(os.Getpid()) + "#" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}
	return nil
}

// WithNameServers sets the name server addresses ("host:port" each). Requests
// go to one of them and fail over to the next on transport errors.
func WithNameServers(addrs ...string) Option {
	return optionFunc(func(c *config) { c.nameServers = slices.Clone(addrs) })
}

// WithNameServerResolver fetches the name server addresses from an HTTP
// address service (a GET answering "host:port;host:port"), at New and then
// every WithResolverRefreshInterval. Addresses given with WithNameServers are
// used until (and when) the service cannot be reached.
func WithNameServerResolver(url string) Option {
	return optionFunc(func(c *config) { c.resolverURL = url })
}

// WithResolverRefreshInterval sets how often the address service is asked
// again (DefaultResolverRefresh).
func WithResolverRefreshInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.resolverRefresh = d })
}

// WithHTTPClient sets the HTTP client used for the address service.
func WithHTTPClient(hc *http.Client) Option { return optionFunc(func(c *config) { c.httpClient = hc }) }

// WithInstanceName sets the instance part of the client id
// ("<ip>@<instance>"). The default, "<pid>#<nanotime>", differs between
// Clients; two Clients with the same id would look like one consumer to a
// broker.
func WithInstanceName(name string) Option {
	return optionFunc(func(c *config) { c.instanceName = name })
}

// WithClientIP sets the IP shown in the client id and in unique message ids
// (default: the first non-loopback IPv4 address, else 127.0.0.1).
func WithClientIP(ip netip.Addr) Option { return optionFunc(func(c *config) { c.clientIP = ip }) }

// WithCredentials enables ACL signing (protocol §8) of every request to
// brokers and name servers.
func WithCredentials(cr Credentials) Option {
	return optionFunc(func(c *config) { cc := cr; c.creds = &cc })
}

// WithTLSConfig makes every connection (brokers and name servers) use TLS
// with cfg. Certificates are verified as crypto/tls does (cfg.RootCAs, or the
// system roots); the only way to turn verification off is to set
// cfg.InsecureSkipVerify yourself. A nil cfg means a default config.
func WithTLSConfig(cfg *tls.Config) Option {
	return optionFunc(func(c *config) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.tls = cfg.Clone()
	})
}

// WithRequestTimeout bounds each request whose ctx has no deadline
// (DefaultRequestTimeout). With a deadline, the ctx alone bounds it.
func WithRequestTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.requestTimeout = d })
}

// WithDialTimeout bounds each connection attempt (DefaultDialTimeout).
func WithDialTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.dialTimeout = d })
}

// WithRouteRefreshInterval sets the period of the route refresh
// (DefaultRouteRefresh).
func WithRouteRefreshInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.routeRefresh = d })
}

// WithHeartbeatInterval sets the period of heartbeats to the brokers in use
// (DefaultHeartbeat).
func WithHeartbeatInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.heartbeat = d })
}

// WithLogger sets the logger; nil (the default) discards.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// DefaultHeaderEncoding is the header encoding of the requests a Client
// sends unless WithHeaderEncoding says otherwise: RocketMQ's binary
// encoding, which Java and Go brokers and name servers decode on any frame
// (as they do JSON) and which costs a fraction of JSON's CPU to write and
// to read. A request the binary header cannot carry (a code above 32767)
// goes in JSON.
const DefaultHeaderEncoding = protocol.SerializeRocketMQ

// WithHeaderEncoding sets the header encoding of the requests the Client
// sends, and of its answers to the requests brokers send it:
// protocol.SerializeRocketMQ (DefaultHeaderEncoding) or
// protocol.SerializeJSON, for a server that decodes only JSON. Responses
// are decoded in whichever encoding each one comes in.
func WithHeaderEncoding(st protocol.SerializeType) Option {
	return optionFunc(func(c *config) { c.headerEncoding = st })
}

// WithRemotingOptions passes options to every connection the Client dials
// (frame size, in-flight limits, serialize type, …). TLS, the logger and the
// request handler are set by the Client.
func WithRemotingOptions(opts ...remoting.Option) Option {
	return optionFunc(func(c *config) { c.remotingOpts = append(c.remotingOpts, opts...) })
}

// Client is a connection to a RocketMQ cluster: name server lookups, a route
// cache, one multiplexed connection per broker address, heartbeats, and the
// handling of requests brokers send to clients. Producers, pulls and admin
// calls are made through it.
//
// A Client is safe for concurrent use. It owns background goroutines (route
// refresh, heartbeat, address resolution, and those started for its
// producers and consumer groups); Close stops and joins all of them and
// closes every connection. There is no global state: Clients with different
// settings coexist in one process.
type Client struct {
	cfg      config
	log      *slog.Logger
	clientID string
	uniq     *protocol.UniqIDGenerator

	ctx    context.Context // cancelled by Close; parent of owned goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	life struct {
		sync.Mutex
		closing bool
	}

	ns struct {
		sync.Mutex
		addrs []string
		cur   int
	}

	conns struct {
		sync.Mutex
		closed bool
		m      map[string]*connSlot
	}

	routes struct {
		sync.RWMutex
		m   map[string]*TopicRoute // routes the name servers know
		def map[string]*TopicRoute // producer routes derived from TBW102
	}

	handlers struct {
		sync.RWMutex
		next uint64
		m    map[int32][]handlerEntry
	}

	consumers struct {
		sync.Mutex
		next uint64
		m    map[uint64]consumerReg
	}

	producers struct {
		sync.Mutex
		m map[string]int // group → live producers
	}

	signers sync.Pool // *signer

	// pullFrom remembers, per queue (protocol.MessageQueue), the broker id
	// (int64) the last pull suggested; absent = master.
	pullFrom sync.Map

	requests requestTable // request.go: requests waiting for replies
}

type connSlot struct {
	conn     *remoting.Conn
	dialing  chan struct{} // closed when a dial in progress ends
	failures int
	retryAt  time.Time
	lastErr  error
}

type handlerEntry struct {
	id uint64
	h  func(ctx context.Context, brokerAddr string, req *protocol.Command) *protocol.Command
}

type consumerReg struct {
	group string
	data  func() protocol.ConsumerData
}

// New returns a running Client configured by opts. When an address service
// is configured it is asked once before New returns (bounded by the dial
// timeout); failing that, the WithNameServers addresses are used. New starts
// the route-refresh and heartbeat goroutines.
func New(opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.logger}
	c.clientID = cfg.clientIP.String() + "@" + cfg.instanceName
	c.uniq = protocol.NewUniqIDGenerator(cfg.clientIP, os.Getpid())
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.ns.addrs = slices.Clone(cfg.nameServers)
	c.conns.m = make(map[string]*connSlot)
	c.routes.m = make(map[string]*TopicRoute)
	c.routes.def = make(map[string]*TopicRoute)
	c.handlers.m = make(map[int32][]handlerEntry)
	c.consumers.m = make(map[uint64]consumerReg)
	c.producers.m = make(map[string]int)
	c.signers.New = func() any { return newSigner() }
	if cfg.resolverURL != "" {
		ctx, cancel := context.WithTimeout(c.ctx, cfg.dialTimeout)
		err := c.resolveNameServers(ctx)
		cancel()
		if err != nil {
			if len(cfg.nameServers) == 0 {
				c.cancel()
				return nil, fmt.Errorf("client: name server resolver: %w", err)
			}
			c.log.Warn("client: name server resolver failed; using the configured addresses", "err", err)
		}
		c.goStart("resolver", c.resolverLoop)
	}
	c.goStart("route-refresh", c.routeLoop)
	c.goStart("heartbeat", c.heartbeatLoop)
	return c, nil
}

// ClientID returns the id this client gives brokers: "<ip>@<instance>".
func (c *Client) ClientID() string { return c.clientID }

// Close stops the Client: background goroutines (its own, and those of its
// producers and consumer groups) see their ctx cancelled and are joined, and
// every connection is closed (calls in flight fail with an error wrapping
// ErrClosed or remoting.ErrConnClosed). Producers made from the Client are
// unusable afterwards. Close is idempotent and safe from any goroutine except
// a callback or handler run by the Client, which it would wait for.
func (c *Client) Close() error {
	c.life.Lock()
	if c.life.closing {
		c.life.Unlock()
		return nil
	}
	c.life.closing = true
	c.life.Unlock()
	c.closed.Store(true)
	c.cancel()

	c.conns.Lock()
	c.conns.closed = true
	var conns []*remoting.Conn
	for _, s := range c.conns.m {
		if s.conn != nil {
			conns = append(conns, s.conn)
		}
	}
	c.conns.m = nil
	c.conns.Unlock()
	for _, cn := range conns {
		_ = cn.Close() // always nil
	}
	c.wg.Wait()
	c.requests.failAll(ErrClosed)
	return nil
}

// goStart runs fn on a goroutine the Client owns: fn's ctx is cancelled by
// Close, which waits for fn to return. It returns false, without running
// fn, once Close has begun.
func (c *Client) goStart(name string, fn func(ctx context.Context)) bool {
	c.life.Lock()
	defer c.life.Unlock()
	if c.life.closing {
		return false
	}
	c.wg.Add(1)
	go pprof.Do(c.ctx, pprof.Labels("rocketmq-client", name), func(ctx context.Context) {
		defer c.wg.Done()
		fn(ctx)
	})
	return true
}

// logger returns the Client's logger (never nil).
func (c *Client) logger() *slog.Logger { return c.log }

// --- connections ---

// conn returns the connection to addr, dialing it when there is none (or
// the previous one closed). Concurrent callers share one dial. After a
// failed dial, further attempts wait an exponential backoff (up to
// maxDialBackoff); a caller whose ctx ends before the backoff would gets the
// last dial error at once. A caller that waited (for another caller's dial
// or for the backoff) and saw a dial fail meanwhile gets that dial's error
// rather than waiting for the next window: so a call waits at most one
// backoff and one dial, however many other callers (heartbeats, other
// sends) keep taking the windows of an unreachable address.
func (c *Client) conn(ctx context.Context, addr string) (*remoting.Conn, error) {
	seen := -1 // the slot's failure count when this call first waited
	for {
		c.conns.Lock()
		if c.conns.closed {
			c.conns.Unlock()
			return nil, ErrClosed
		}
		s := c.conns.m[addr]
		if s == nil {
			s = &connSlot{}
			c.conns.m[addr] = s
		}
		if cn := s.conn; cn != nil {
			select {
			case <-cn.Done():
				s.conn = nil
				c.conns.Unlock()
				_ = cn.Close() // joins its goroutines; always nil
				continue
			default:
				c.conns.Unlock()
				return cn, nil
			}
		}
		if seen >= 0 && s.failures > seen {
			err := s.lastErr
			c.conns.Unlock()
			return nil, &unreachableError{addr: addr, err: err}
		}
		if ch := s.dialing; ch != nil {
			if seen < 0 {
				seen = s.failures
			}
			c.conns.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if wait := time.Until(s.retryAt); wait > 0 {
			lastErr := s.lastErr
			if seen < 0 {
				seen = s.failures
			}
			c.conns.Unlock()
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
				return nil, &unreachableError{addr: addr, err: lastErr}
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-c.ctx.Done():
				t.Stop()
				return nil, ErrClosed
			}
		}
		ch := make(chan struct{})
		s.dialing = ch
		c.conns.Unlock()

		cn, err := c.dial(ctx, addr)

		c.conns.Lock()
		s.dialing = nil
		close(ch)
		if err != nil {
			if ctx.Err() == nil { // our own failure, not the caller giving up
				s.failures++
				s.retryAt = time.Now().Add(dialBackoff(s.failures))
				s.lastErr = err
			}
			c.conns.Unlock()
			return nil, &unreachableError{addr: addr, err: err}
		}
		if c.conns.closed {
			c.conns.Unlock()
			_ = cn.Close()
			return nil, ErrClosed
		}
		s.conn, s.failures, s.retryAt, s.lastErr = cn, 0, time.Time{}, nil
		c.conns.Unlock()
		return cn, nil
	}
}

// addrDown reports whether addr's last dial failed and its backoff has
// not passed: requests that can go elsewhere (a pull or an offset request
// to a slave when the master is down) do.
func (c *Client) addrDown(addr string) bool {
	c.conns.Lock()
	defer c.conns.Unlock()
	s := c.conns.m[addr]
	return s != nil && s.conn == nil && s.failures > 0 && time.Now().Before(s.retryAt)
}

func dialBackoff(failures int) time.Duration {
	d := minDialBackoff
	for i := 1; i < failures && d < maxDialBackoff; i++ {
		d *= 2
	}
	return min(d, maxDialBackoff)
}

func (c *Client) dial(ctx context.Context, addr string) (*remoting.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.dialTimeout)
	defer cancel()
	opts := make([]remoting.Option, 0, 4+len(c.cfg.remotingOpts))
	opts = append(opts, remoting.WithLogger(c.log), remoting.WithSerializeType(c.cfg.headerEncoding))
	opts = append(opts, c.cfg.remotingOpts...)
	if c.cfg.tls != nil {
		opts = append(opts, remoting.WithTLSConfig(c.cfg.tls))
	}
	opts = append(opts, remoting.WithRequestHandler(func(ctx context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		return c.dispatch(ctx, addr, req)
	}))
	cn, err := remoting.Dial(dctx, addr, opts...)
	if err != nil {
		return nil, err
	}
	c.log.Debug("client: connected", "addr", addr)
	return cn, nil
}

// dropConn forgets addr's connection (closing it) so that the next request
// dials again. Used when a broker left every route.
func (c *Client) dropConn(addr string) {
	c.conns.Lock()
	var cn *remoting.Conn
	if s := c.conns.m[addr]; s != nil && s.dialing == nil {
		cn = s.conn
		delete(c.conns.m, addr)
	}
	c.conns.Unlock()
	if cn != nil {
		_ = cn.Close()
	}
}

// requestCtx bounds ctx with the request timeout when it has no deadline.
func (c *Client) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.cfg.requestTimeout)
}

// invoke sends req to addr on the pooled connection (ACL-signed when
// credentials are set) and returns the response, whatever its code: err is
// non-nil only for transport failures (no connection, timeout, connection
// lost). Use protocol.ResponseError to turn a response into an error.
// Without a ctx deadline the request timeout applies. req may be reused
// once invoke returns.
func (c *Client) invoke(ctx context.Context, addr string, req *protocol.Command) (*protocol.Command, error) {
	var timeout time.Duration
	if _, ok := ctx.Deadline(); !ok {
		timeout = c.cfg.requestTimeout
	}
	return c.invokeTimeout(ctx, addr, req, timeout)
}

// invokeTimeout is invoke bounded by ctx and, when timeout > 0, by timeout
// from now, whichever ends first. On an open connection the timeout is
// enforced by the connection's own timer (remoting.Conn.InvokeTimeout),
// sparing a context.WithTimeout and its timer per request; a dial, when
// needed, is bounded by a ctx with the timeout.
func (c *Client) invokeTimeout(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration) (*protocol.Command, error) {
	cn := c.openConn(addr)
	if cn == nil {
		start := time.Now()
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, timeout)
		}
		var err error
		cn, err = c.conn(cctx, addr)
		cancel()
		if err != nil {
			return nil, err
		}
		if timeout > 0 {
			timeout = max(timeout-time.Since(start), time.Nanosecond)
		}
	}
	c.sign(req)
	resp, err := cn.InvokeTimeout(ctx, req, timeout)
	if err != nil {
		return nil, &sentError{addr: addr, err: err}
	}
	return resp, nil
}

// openConn returns the open connection to addr, or nil when there is none
// (conn dials it).
func (c *Client) openConn(addr string) *remoting.Conn {
	c.conns.Lock()
	defer c.conns.Unlock()
	if c.conns.closed {
		return nil
	}
	s := c.conns.m[addr]
	if s == nil || s.conn == nil {
		return nil
	}
	select {
	case <-s.conn.Done():
		return nil
	default:
		return s.conn
	}
}

// invokeOneway sends req to addr with the oneway bit: no response comes.
// A nil error means the request was queued, not that it arrived.
func (c *Client) invokeOneway(ctx context.Context, addr string, req *protocol.Command) error {
	ctx, cancel := c.requestCtx(ctx)
	defer cancel()
	cn, err := c.conn(ctx, addr)
	if err != nil {
		return err
	}
	c.sign(req)
	if err := cn.InvokeOneway(ctx, req); err != nil {
		return &sentError{addr: addr, err: err}
	}
	return nil
}

// --- server-initiated requests ---

// handleServerRequest registers h for requests brokers send with code
// (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, …). Every handler of
// a code runs, in registration order, on the connection's handler goroutine
// (ctx is cancelled when the connection closes); the first non-nil response
// is sent back (nothing is sent for oneway requests). remove unregisters h.
func (c *Client) handleServerRequest(code int32, h func(ctx context.Context, brokerAddr string, req *protocol.Command) *protocol.Command) (remove func()) {
	c.handlers.Lock()
	c.handlers.next++
	id := c.handlers.next
	c.handlers.m[code] = append(c.handlers.m[code], handlerEntry{id: id, h: h})
	c.handlers.Unlock()
	return func() {
		c.handlers.Lock()
		defer c.handlers.Unlock()
		c.handlers.m[code] = slices.DeleteFunc(c.handlers.m[code], func(e handlerEntry) bool { return e.id == id })
		if len(c.handlers.m[code]) == 0 {
			delete(c.handlers.m, code)
		}
	}
}

func (c *Client) dispatch(ctx context.Context, addr string, req *protocol.Command) *protocol.Command {
	c.handlers.RLock()
	hs := slices.Clone(c.handlers.m[req.Code])
	c.handlers.RUnlock()
	if len(hs) == 0 {
		c.log.Debug("client: unhandled request from broker", "addr", addr, "code", req.Code)
		return protocol.NewResponse(req, protocol.ResRequestCodeNotSupported,
			" request type "+strconv.Itoa(int(req.Code))+" not supported")
	}
	var resp *protocol.Command
	for _, e := range hs {
		if r := e.h(ctx, addr, req); r != nil && resp == nil {
			resp = r
		}
	}
	return resp
}

// --- name servers ---

func (c *Client) nameServers() ([]string, int) {
	c.ns.Lock()
	defer c.ns.Unlock()
	return c.ns.addrs, c.ns.cur
}

// nsInvoke sends req to a name server, starting with the one that answered
// last and failing over to the next on transport errors. Each try gets at
// most the request timeout. The response is returned whatever its code.
func (c *Client) nsInvoke(ctx context.Context, req *protocol.Command) (*protocol.Command, error) {
	addrs, cur := c.nameServers()
	if len(addrs) == 0 {
		return nil, ErrNoNameServer
	}
	var errs []error
	for i := range addrs {
		if ctx.Err() != nil {
			break
		}
		idx := (cur + i) % len(addrs)
		tctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
		resp, err := c.invoke(tctx, addrs[idx], req)
		cancel()
		if err == nil {
			if i != 0 {
				c.ns.Lock()
				if slices.Equal(c.ns.addrs, addrs) {
					c.ns.cur = idx
				}
				c.ns.Unlock()
			}
			return resp, nil
		}
		errs = append(errs, err)
		if errors.Is(err, ErrClosed) {
			break
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return nil, fmt.Errorf("%w: %w", ErrNoNameServer, errors.Join(errs...))
}

// resolveNameServers asks the address service for the name server list.
func (c *Client) resolveNameServers(ctx context.Context) error {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.resolverURL, nil)
	if err != nil {
		return err
	}
	resp, err := c.cfg.httpClient.Do(hreq)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("address service answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResolverBody+1))
	if err != nil {
		return err
	}
	if len(body) > maxResolverBody {
		return fmt.Errorf("address service answer longer than %d bytes", maxResolverBody)
	}
	addrs, err := parseNameServerList(string(body))
	if err != nil {
		return err
	}
	c.ns.Lock()
	if !slices.Equal(c.ns.addrs, addrs) {
		c.ns.addrs, c.ns.cur = addrs, 0
		c.log.Info("client: name servers updated", "addrs", addrs)
	}
	c.ns.Unlock()
	return nil
}

// parseNameServerList parses "host:port;host:port" (whitespace ignored).
func parseNameServerList(s string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(strings.TrimSpace(s), ";") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("address service: bad address %q: %w", a, err)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("address service: empty address list")
	}
	return out, nil
}

func (c *Client) resolverLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.resolverRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, c.cfg.dialTimeout)
			if err := c.resolveNameServers(rctx); err != nil && ctx.Err() == nil {
				c.log.Warn("client: name server resolver failed", "err", err)
			}
			cancel()
		}
	}
}

// --- heartbeats ---

// registerConsumer adds a consumer group to the heartbeats: every heartbeat
// then carries data() and goes to every broker address of every topic
// data().SubscriptionDataSet names. data is called on the heartbeat
// goroutine and must be safe for that. unregister removes it.
func (c *Client) registerConsumer(group string, data func() protocol.ConsumerData) (unregister func()) {
	c.consumers.Lock()
	c.consumers.next++
	id := c.consumers.next
	c.consumers.m[id] = consumerReg{group: group, data: data}
	c.consumers.Unlock()
	return func() {
		c.consumers.Lock()
		delete(c.consumers.m, id)
		c.consumers.Unlock()
	}
}

func (c *Client) registerProducer(group string) (unregister func()) {
	c.producers.Lock()
	c.producers.m[group]++
	c.producers.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.producers.Lock()
			if c.producers.m[group]--; c.producers.m[group] <= 0 {
				delete(c.producers.m, group)
			}
			c.producers.Unlock()
		})
	}
}

// heartbeatData builds the heartbeat body and the addresses it goes to:
// masters of every cached route when producers exist, and every address of
// every topic consumers subscribe.
func (c *Client) heartbeatData(ctx context.Context) (*protocol.HeartbeatData, []string) {
	hb := &protocol.HeartbeatData{ClientID: c.clientID}
	c.producers.Lock()
	for g := range c.producers.m {
		hb.ProducerDataSet = append(hb.ProducerDataSet, protocol.ProducerData{GroupName: g})
	}
	c.producers.Unlock()
	c.consumers.Lock()
	regs := make([]consumerReg, 0, len(c.consumers.m))
	for _, r := range c.consumers.m {
		regs = append(regs, r)
	}
	c.consumers.Unlock()
	slices.SortFunc(hb.ProducerDataSet, func(a, b protocol.ProducerData) int { return strings.Compare(a.GroupName, b.GroupName) })

	addrs := map[string]bool{}
	if len(hb.ProducerDataSet) > 0 {
		c.routes.RLock()
		for _, m := range []map[string]*TopicRoute{c.routes.m, c.routes.def} {
			for _, r := range m {
				for _, a := range r.masters {
					addrs[a] = true
				}
			}
		}
		c.routes.RUnlock()
	}
	for _, reg := range regs {
		cd := reg.data()
		hb.ConsumerDataSet = append(hb.ConsumerDataSet, cd)
		for _, sd := range cd.SubscriptionDataSet {
			r, err := c.Route(ctx, sd.Topic)
			if err != nil {
				continue // e.g. a retry topic not created yet
			}
			for _, bd := range r.Data.BrokerDatas {
				for _, a := range bd.BrokerAddrs {
					addrs[a] = true
				}
			}
		}
	}
	list := make([]string, 0, len(addrs))
	for a := range addrs {
		list = append(list, a)
	}
	slices.Sort(list)
	return hb, list
}

// heartbeatNow sends one heartbeat round to every broker in use and
// returns the joined errors of the brokers that failed (transport errors or
// non-success replies). Nothing is sent when the Client has no producer and
// no consumer group.
func (c *Client) heartbeatNow(ctx context.Context) error {
	hb, addrs := c.heartbeatData(ctx)
	if len(hb.ProducerDataSet) == 0 && len(hb.ConsumerDataSet) == 0 {
		return nil
	}
	body, err := hb.Encode()
	if err != nil {
		return fmt.Errorf("client: heartbeat: %w", err)
	}
	var errs []error
	for _, a := range addrs {
		req := protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = body
		resp, err := c.invoke(ctx, a, req)
		if err == nil {
			err = protocol.ResponseError(resp)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("client: heartbeat to %s: %w", a, err))
		}
	}
	return errors.Join(errs...)
}

func (c *Client) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.heartbeatNow(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("client: heartbeat", "err", err)
			}
		}
	}
}

// localIPv4 returns the first non-loopback IPv4 address of an up
// interface, or 127.0.0.1.
func localIPv4() netip.Addr {
	ifs, err := net.Interfaces()
	if err == nil {
		for _, ifc := range ifs {
			if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
				continue
			}
			addrs, err := ifc.Addrs()
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if pn, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(pn.IP); ok && ip.Unmap().Is4() {
						return ip.Unmap()
					}
				}
			}
		}
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}
