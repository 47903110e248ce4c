package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Errors returned by the Broker's lifecycle methods.
var (
	// ErrClosed is returned by Start after Shutdown or Close.
	ErrClosed = errors.New("broker: closed")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("broker: already started")
)

// TopicConfig is the broker's configuration of one topic (name, queue
// counts, permission bits, filter type). It is plain data; the broker hands
// out copies.
type TopicConfig = protocol.TopicConfig

// GroupConfig is the broker's configuration of one subscription (consumer)
// group: retry policy, consume switches. Plain data; the broker hands out
// copies.
type GroupConfig = protocol.SubscriptionGroupConfig

// Subscription is what a consumer group registered for a topic (by
// heartbeat, or carried by a pull request with the SUBSCRIPTION flag).
type Subscription struct {
	Topic          string
	Expression     string
	ExpressionType string
	Tags           []string
	TagCodes       []int64
	SubVersion     int64
	ClassFilter    bool
}

// extensions is what the client-facing subsystems (subsystems.go) plug into
// the core. Every field may be nil; the core then behaves as documented per
// field.
type extensions struct {
	// register adds the subsystem's request processors to the server
	// (called once in New).
	register []func(s *remoting.Server)
	// start runs background work; each gets a ctx cancelled at shutdown and
	// runs on a goroutine the broker owns and joins.
	start []func(ctx context.Context)
	// subscription returns the subscription a consumer group registered by
	// heartbeat for topic; nil or !ok makes the pull path return all
	// messages unless the request carries the SUBSCRIPTION flag.
	subscription func(group, topic string) (sub Subscription, ok bool)
	// beforeStore may rewrite a single (non-batch) message about to be
	// stored by the send path, or reject it with a *protocol.Error. It runs
	// after validation and auto-create, before the record is encoded.
	// It may run on a connection's reader goroutine, so it must not block,
	// save in the cases sendMayBlock (processor_send.go) keeps off readers:
	// %RETRY% topics and the first timer message.
	beforeStore func(ctx context.Context, m *InboundMessage) error
	// afterStore is told about stored messages of the send path (long-poll
	// waiters are woken by the core). res.MsgID is empty (the single-message
	// path does not build it for every message):
	// protocol.OffsetMsgID(b.host, res.PhysicalOffset) is the id.
	afterStore func(ctx context.Context, m *InboundMessage, res StoredResult)
	// producerChannels returns the live connections that heartbeated for a
	// producer group (transaction check-back picks one); nil func or an
	// empty result means no producer is online.
	producerChannels func(group string) []*remoting.ServerConn
	// onDisconnect is called once per closed client connection, after its
	// processors returned (an additive extension of the seam: the remoting
	// server's OnDisconnect belongs to the broker, which fans it out).
	onDisconnect func(sc *remoting.ServerConn)
}

// InboundMessage is a message accepted by the send path (or handed to
// storeInternal) before it is stored. Properties is the raw properties
// string (protocol §4.2); use Property, SetProperty and DeleteProperties.
// It is plain data owned by the goroutine handling the request.
type InboundMessage struct {
	Topic             string
	QueueID           int32
	Flag              int32
	Body              []byte
	Properties        string
	SysFlag           int32
	BornTimestamp     int64
	BornHost          netip.AddrPort
	ReconsumeTimes    int32
	MaxReconsumeTimes int32 // -1 = not given by the client
	ProducerGroup     string
	// DelayLevel is the DELAY property parsed when the message arrived (0
	// when absent or not a number); informational: storage uses Properties.
	DelayLevel int32
	// PreparedTransactionOffset is stored as PREPARED_TRANSACTION_OFFSET.
	PreparedTransactionOffset int64
	Code                      int32 // request code (10, 310, 324, …)
	ClientVersion             int32 // version field of the request
	// Conn is the connection the message came on (nil for storeInternal
	// callers that have none).
	Conn *remoting.ServerConn
}

// Property returns the value of a property.
func (m *InboundMessage) Property(key string) (string, bool) {
	return protocol.PropertyValue(m.Properties, key)
}

// SetProperty sets key to value, replacing any previous value.
func (m *InboundMessage) SetProperty(key, value string) {
	b := protocol.AppendPropertiesExcept(make([]byte, 0, len(m.Properties)+len(key)+len(value)+2), m.Properties, key)
	m.Properties = string(protocol.AppendProperty(b, key, value))
}

// DeleteProperties removes the named properties.
func (m *InboundMessage) DeleteProperties(keys ...string) {
	m.Properties = string(protocol.AppendPropertiesExcept(make([]byte, 0, len(m.Properties)), m.Properties, keys...))
}

// StoredResult tells where a message was stored.
type StoredResult struct {
	QueueOffset    int64
	PhysicalOffset int64
	StoreTimestamp int64 // ms
	MsgID          string
}

// Lifecycle states.
const (
	stateNew int32 = iota
	stateRunning
	stateStopping
	stateClosed
)

// Broker is an embedded RocketMQ broker: it serves the remoting protocol to
// unmodified RocketMQ clients (producers, push/pull consumers, admin tools),
// stores messages durably in Pebble under the data dir, and registers its
// topics with name servers.
//
// New validates the options; Start opens the store, listens and registers;
// Shutdown stops gracefully; Close stops at once. All methods are safe for
// concurrent use.
type Broker struct {
	cfg config
	log *slog.Logger

	store *store.Store
	srv   *remoting.Server
	ext   extensions
	lp    *longPoll
	stats brokerStats // stats.go
	tx    *transactions
	live  liveConfig // processor_config.go
	// filters caches compiled SQL92 selectors (filter.go).
	filters exprCache
	// pop serves the POP family (pop.go); set by New.
	pop *popService

	topics topicTable
	groups groupTable

	// Set by Start before the listener serves; read-only afterwards.
	addr      string         // bound address
	host      netip.AddrPort // advertised address (store host)
	hostStr   string
	uniq      *protocol.UniqIDGenerator
	regs      []*registrar
	startedAt time.Time
	epoch     store.Epoch // a master's current epoch
	master    *haMaster   // a master's HA listener (nil when it has none)
	slave     *haSlave    // a slave's replication (nil on a master)

	state atomic.Int32

	ctx    context.Context // lifetime of owned goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// Registration loops have their own lifetime: they stop before the
	// broker unregisters, while everything else still runs.
	regCtx    context.Context
	regCancel context.CancelFunc
	regWG     sync.WaitGroup

	life struct {
		sync.Mutex
		done bool  // Close or Shutdown finished
		err  error // their result
	}

	bufs  sync.Pool // *[]byte record and response buffers
	sends sync.Pool // *pendingSend

	// handOffs holds a slot per send handed off a reader goroutine
	// (processor_send.go, handOff).
	handOffs chan struct{}
}

// New returns a Broker configured by opts. It validates the options and
// prepares the server; nothing is opened or listened on until Start.
func New(opts ...Option) (*Broker, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, log: cfg.logger}
	b.live.init(&b.cfg)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.regCtx, b.regCancel = context.WithCancel(context.Background())
	b.topics.init()
	b.groups.init()
	b.bufs.New = func() any { s := make([]byte, 0, 4096); return &s }
	b.sends.New = func() any { return newPendingSend(b) }
	b.handOffs = make(chan struct{}, maxHandOffs)
	b.lp = newLongPoll(b)
	b.tx = newTransactions(b)
	sopts := append([]remoting.ServerOption{
		remoting.WithLogger(cfg.logger),
		remoting.WithOnDisconnect(b.onDisconnect),
	}, cfg.remotingOpts...)
	srv, err := remoting.NewServer(sopts...)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	b.srv = srv
	b.registerProcessors()
	b.ext = newExtensions(b)
	for _, reg := range b.ext.register {
		reg(srv)
	}
	return b, nil
}

func (b *Broker) onDisconnect(sc *remoting.ServerConn) {
	b.lp.dropConn(sc)
	if f := b.ext.onDisconnect; f != nil {
		f(sc)
	}
}

// Start opens the store, creates the system topics, listens, registers
// with the name servers and starts the broker's background goroutines. ctx
// bounds the listen and the first registration; a name server that cannot
// be reached is retried in the background. Start may be called once.
func (b *Broker) Start(ctx context.Context) error {
	if !b.state.CompareAndSwap(stateNew, stateRunning) {
		if b.state.Load() == stateRunning {
			return ErrStarted
		}
		return ErrClosed
	}
	if err := b.start(ctx); err != nil {
		b.state.Store(stateClosed)
		err = errors.Join(err, b.srv.Close())
		b.lp.close(false)
		b.stopRegistrars()
		b.closeRegistrarConns()
		b.cancel()
		b.wg.Wait()
		if b.store != nil {
			err = errors.Join(err, b.store.Close())
		}
		b.life.Lock()
		b.life.done, b.life.err = true, nil
		b.life.Unlock()
		return err
	}
	return nil
}

func (b *Broker) start(ctx context.Context) error {
	b.startedAt = b.cfg.clock()
	mode := store.FlushSync
	if b.cfg.flushMode == FlushAsync {
		mode = store.FlushAsync
	}
	sopts := store.Options{
		FlushMode:         mode,
		Logger:            b.log,
		Clock:             b.cfg.clock,
		Notify:            b.notifyLog,
		MaxRecordBytes:    b.cfg.maxMessageSize + protocol.MaxPropertiesLength + 2*protocol.MaxTopicLength + 1024,
		DiskHighWatermark: b.cfg.diskHighWater,
	}
	if b.cfg.storeHook != nil {
		b.cfg.storeHook(&sopts)
	}
	st, err := store.Open(b.cfg.dataDir, sopts)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	b.store = st
	if err := b.loadTopics(); err != nil {
		return err
	}
	if err := b.loadGroups(); err != nil {
		return err
	}
	if err := b.createSystemTopics(); err != nil {
		return err
	}
	if err := b.startMasterLog(); err != nil {
		return err
	}
	lc := b.srv.ListenConfig()
	l, err := lc.Listen(ctx, "tcp", b.cfg.listenAddr)
	if err != nil {
		return fmt.Errorf("broker: listen %s: %w", b.cfg.listenAddr, err)
	}
	b.addr = l.Addr().String()
	b.host, err = advertisedAddr(b.cfg.advertised, l.Addr())
	if err != nil {
		return errors.Join(err, l.Close())
	}
	b.hostStr = b.host.String()
	b.uniq = protocol.NewUniqIDGenerator(b.host.Addr(), os.Getpid())
	for _, ns := range b.cfg.nameServers {
		b.regs = append(b.regs, newRegistrar(b, ns))
	}
	if err := b.startHA(ctx); err != nil {
		return errors.Join(err, l.Close())
	}
	// Everything processors read is set: serve.
	b.goOwned("serve", func(context.Context) {
		if err := b.srv.Serve(l); !errors.Is(err, remoting.ErrServerClosed) {
			b.log.Error("broker: server stopped accepting", "err", err)
		}
	})
	b.goOwned("longpoll", b.lp.run)
	b.goOwned("retention", b.runRetention)
	if !b.isSlave() {
		b.goOwned("txcheck", b.tx.run) // a slave checks nothing back: its master does
	}
	for i, f := range b.ext.start {
		b.goOwned("ext-"+strconv.Itoa(i), f)
	}
	// The first registration is attempted synchronously so that routes
	// exist when Start returns (when the name servers are up).
	for _, r := range b.regs {
		if err := r.registerFirst(ctx); err != nil {
			if errors.Is(err, errRegistrationConflict) {
				return err
			}
			r.retrySoon = true
			r.closeConn()
			b.log.Warn("broker: first registration failed; retrying in the background", "namesrv", r.addr, "err", err)
		}
	}
	for _, r := range b.regs {
		b.goRegistrar(r)
	}
	b.log.Info("broker: started", "addr", b.addr, "advertised", b.hostStr, "name", b.cfg.brokerName,
		"cluster", b.cfg.clusterName, "flush", b.cfg.flushMode, "role", b.haDescribe(), "namesrv", b.cfg.nameServers)
	return nil
}

// goOwned runs fn on a goroutine the broker joins at shutdown.
func (b *Broker) goOwned(name string, fn func(ctx context.Context)) {
	b.wg.Add(1)
	go pprof.Do(b.ctx, pprof.Labels("broker", name), func(ctx context.Context) {
		defer b.wg.Done()
		fn(ctx)
	})
}

// advertisedAddr chooses the store host: the configured address, or the
// bound one with an unspecified IP replaced by a usable local one.
func advertisedAddr(configured string, bound net.Addr) (netip.AddrPort, error) {
	if configured != "" {
		return netip.ParseAddrPort(configured)
	}
	ta, ok := bound.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("broker: listener address %v is not TCP", bound)
	}
	ap := ta.AddrPort()
	ip := ap.Addr().Unmap()
	if ip.IsUnspecified() {
		ip = localIPv4()
	}
	return netip.AddrPortFrom(ip, ap.Port()), nil
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

// Addr returns the address the broker listens on ("ip:port"), or "" before
// Start. With port 0 it is the port actually bound.
func (b *Broker) Addr() string {
	if b.state.Load() == stateNew {
		return ""
	}
	return b.addr
}

// AdvertisedAddr returns the address registered with name servers and
// written as store host ("" before Start).
func (b *Broker) AdvertisedAddr() string {
	if b.state.Load() == stateNew {
		return ""
	}
	return b.hostStr
}

// Shutdown stops the broker gracefully: sends are refused
// (SERVICE_NOT_AVAILABLE), parked pulls are answered, the broker
// unregisters from its name servers, the server stops accepting and waits
// for in-flight requests, background goroutines are joined and the store is
// closed (fsynced). When ctx ends first the rest is done at once, as by
// Close, and ctx's error is returned with any other. Later calls return the
// first call's result.
func (b *Broker) Shutdown(ctx context.Context) error {
	return b.stop(ctx, true)
}

// Close stops the broker at once: connections are closed (parked pulls and
// in-flight requests are abandoned), goroutines joined, the store closed.
// Idempotent: later calls return the first result (nil if it succeeded).
func (b *Broker) Close() error {
	return b.stop(context.Background(), false)
}

func (b *Broker) stop(ctx context.Context, graceful bool) error {
	b.life.Lock()
	defer b.life.Unlock()
	if b.life.done {
		return b.life.err
	}
	prev := b.state.Swap(stateStopping)
	var err error
	if prev == stateRunning {
		if m := b.master; m != nil {
			m.waiters.close() // sends held for the slaves are answered now
		}
		if graceful {
			b.lp.close(true)
			b.stopRegistrars()
			b.unregisterAll(ctx)
			err = errors.Join(err, b.srv.Shutdown(ctx))
		} else {
			b.stopRegistrars()
			b.closeRegistrarConns()
			err = errors.Join(err, b.srv.Close())
		}
		b.lp.close(false)
		b.cancel()
		b.wg.Wait()
		if cerr := b.store.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("broker: close store: %w", cerr))
		}
	} else {
		b.regCancel()
		b.cancel()
		err = errors.Join(err, b.srv.Close())
	}
	b.state.Store(stateClosed)
	b.life.done, b.life.err = true, err
	if err == nil {
		b.log.Info("broker: stopped", "addr", b.addr)
	}
	return err
}

// running reports whether the broker accepts writes.
func (b *Broker) running() bool { return b.state.Load() == stateRunning }

// --- the seam used by subsystems.go (see broker-contract) ---

// server returns the remoting server (to send requests to clients).
func (b *Broker) server() *remoting.Server { return b.srv }

// logger returns the broker's logger (never nil).
func (b *Broker) logger() *slog.Logger { return b.log }

// now returns the injectable clock's time.
func (b *Broker) now() time.Time { return b.cfg.clock() }

func (b *Broker) clusterName() string { return b.cfg.clusterName }

func (b *Broker) brokerName() string { return b.cfg.brokerName }

// storeHost returns the advertised address written into stored records.
func (b *Broker) storeHost() netip.AddrPort { return b.host }

// lookupByPhysicalOffset returns the decoded record at a commit-log
// (physical) offset and the raw record it aliases (a private copy).
func (b *Broker) lookupByPhysicalOffset(phys int64) (protocol.MessageExt, []byte, error) {
	rec, err := b.store.GetByPhysicalOffset(phys)
	if err != nil {
		return protocol.MessageExt{}, nil, fmt.Errorf("broker: message at physical offset %d: %w", phys, err)
	}
	m, _, err := protocol.DecodeRecord(rec)
	if err != nil {
		return protocol.MessageExt{}, nil, fmt.Errorf("broker: message at physical offset %d: %w", phys, err)
	}
	return m, rec, nil
}

// storeInternal stores m without the send processor's validation (retry,
// DLQ and schedule re-delivery use it): the record is encoded as is (no
// UNIQ_KEY or CLUSTER added), gets offsets and a store time, and long-poll
// waiters of its queue are woken. It creates no topic. It blocks until the
// store acknowledged (fsync in FlushSync mode); ctx bounds the wait for the
// store to accept the write.
func (b *Broker) storeInternal(ctx context.Context, m *InboundMessage) (StoredResult, error) {
	if m.QueueID < 0 {
		return StoredResult{}, fmt.Errorf("broker: store %s: negative queue id %d", m.Topic, m.QueueID)
	}
	if !b.running() {
		return StoredResult{}, fmt.Errorf("broker: store %s: %w", m.Topic, ErrClosed)
	}
	return b.storeOne(ctx, m)
}

// StoreHealth is a snapshot of the message store's write health.
type StoreHealth struct {
	// DiskFull is true while sends are refused for disk usage above the
	// high-water mark (WithDiskHighWatermark).
	DiskFull bool
	// DiskRefused counts the store writes refused for disk usage.
	DiskRefused int64
	// Failed is the store's sticky write failure (a failed WAL write or
	// fsync), nil while healthy; sends are refused until a restart.
	Failed error
}

// StoreHealth reports the store's write health (zero before Start). Safe
// for concurrent use.
func (b *Broker) StoreHealth() StoreHealth {
	if b.state.Load() == stateNew || b.store == nil {
		return StoreHealth{}
	}
	return StoreHealth{DiskFull: b.store.DiskFull(), DiskRefused: b.store.DiskRefused(), Failed: b.store.Failed()}
}
