package namesrv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

var (
	// ErrServerClosed is returned by Start after Shutdown or Close.
	ErrServerClosed = errors.New("namesrv: server closed")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("namesrv: already started")
)

// Server is an embedded RocketMQ name server. Create it with New, then
// Start it; stop it with Shutdown or Close. All methods are safe for
// concurrent use.
type Server struct {
	cfg    config
	log    *slog.Logger
	rs     *remoting.Server
	routes *routeTable
	kv     *kvStore

	quit     chan struct{} // closed when Shutdown or Close begins
	quitOnce sync.Once
	wg       sync.WaitGroup // the scanner goroutine

	mu struct {
		sync.Mutex
		started bool
		closed  bool
		addr    string
	}
}

// New returns a name server configured by opts. It loads the persisted KV
// config when WithKVConfigDir is given, but listens only in Start.
func New(opts ...Option) (*Server, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	kv, err := newKVStore(cfg.kvDir)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.logger, routes: newRouteTable(), kv: kv, quit: make(chan struct{})}
	ropts := append([]remoting.ServerOption{remoting.WithLogger(cfg.logger)}, cfg.remotingOpts...)
	ropts = append(ropts, remoting.WithOnDisconnect(s.onDisconnect))
	tlsOpts, err := acl.TLSServerOptions(cfg.tlsMode, cfg.tlsConfig)
	if err != nil {
		return nil, fmt.Errorf("namesrv: %w", err)
	}
	ropts = append(ropts, tlsOpts...)
	if cfg.policy != nil {
		ropts = append(ropts, cfg.policy.ServerOption())
	}
	if s.rs, err = remoting.NewServer(ropts...); err != nil {
		return nil, fmt.Errorf("namesrv: %w", err)
	}
	s.registerProcessors()
	return s, nil
}

// Start listens on the configured address and serves it, and starts the
// expiry scanner, on goroutines the Server owns. ctx bounds the bind only.
// Start may be called once; after Shutdown or Close it returns
// ErrServerClosed.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.mu.closed:
		return ErrServerClosed
	case s.mu.started:
		return ErrAlreadyStarted
	}
	addr, err := s.rs.Listen(ctx, s.cfg.listenAddr)
	if err != nil {
		return fmt.Errorf("namesrv: %w", err)
	}
	s.mu.started = true
	s.mu.addr = addr.String()
	s.wg.Add(1)
	go s.scanLoop()
	s.log.Info("namesrv: serving", "addr", s.mu.addr)
	return nil
}

// Addr returns the address the Server listens on ("127.0.0.1:40123"), or ""
// before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.addr
}

// Shutdown stops the Server gracefully: it stops accepting and the scanner,
// lets requests in flight finish (remoting.Server.Shutdown), then closes
// every connection. When ctx ends first everything is closed at once and
// ctx's error is returned. Safe to call more than once, and with Close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.beginClose()
	err := s.rs.Shutdown(ctx)
	s.wg.Wait()
	if errors.Is(err, remoting.ErrServerClosed) {
		err = nil // an earlier Shutdown or Close did the work
	}
	return err
}

// Close stops the Server at once and waits for every goroutine it started.
// Idempotent; it returns nil unless accepting had failed.
func (s *Server) Close() error {
	s.beginClose()
	err := s.rs.Close()
	s.wg.Wait()
	return err
}

func (s *Server) beginClose() {
	s.mu.Lock()
	s.mu.closed = true
	s.mu.Unlock()
	s.quitOnce.Do(func() { close(s.quit) })
}

// scanLoop evicts expired registrations every scan interval until quit.
func (s *Server) scanLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.scanInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
			s.scan()
		}
	}
}

// scan evicts expired registrations once and closes their connections, as
// Java does.
func (s *Server) scan() {
	for _, e := range s.routes.evictExpired(s.cfg.now()) {
		s.log.Info("namesrv: broker expired", "cluster", e.key.cluster, "broker", e.brokerName, "addr", e.key.addr)
		if e.conn != nil {
			_ = e.conn.Close() // never fails; the disconnect hook finds nothing left to evict
		}
	}
}

// onDisconnect evicts the brokers registered on a closed connection.
func (s *Server) onDisconnect(sc *remoting.ServerConn) {
	for _, e := range s.routes.evictConn(sc) {
		s.log.Info("namesrv: broker connection closed", "cluster", e.key.cluster, "broker", e.brokerName,
			"addr", e.key.addr, "err", sc.Err())
	}
}

// respond builds a response to req.
func respond(req *protocol.Command, code int32, remark string) *protocol.Command {
	return protocol.NewResponse(req, code, remark)
}
