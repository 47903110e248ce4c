package embedded

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// ErrInvalidOption is wrapped by Start's errors for unusable options.
var ErrInvalidOption = errors.New("embedded: invalid option")

// pollEvery is how often Start and CreateTopic look at the name server's
// tables while they wait.
const pollEvery = 10 * time.Millisecond

// BrokerName returns the name of broker i of a cluster: "broker-a" …
// "broker-z" for the first 26 (broker.DefaultBrokerName first), then
// "broker-26", "broker-27", ….
func BrokerName(i int) string {
	if i >= 0 && i < 26 {
		return "broker-" + string(rune('a'+i))
	}
	return "broker-" + strconv.Itoa(i)
}

// Cluster is a name server and its brokers running in this process. Its
// accessors are safe for concurrent use; Close and Shutdown stop everything
// Start started and join its goroutines.
type Cluster struct {
	cfg     config
	dir     string
	ownDir  bool // dir is a temporary directory Close removes
	ns      *namesrv.Server
	nsAddrs []string
	brokers []*Broker
	c       *client.Client
	hooks   hooks
	nsTLS   *tls.Config // how clients of the cluster dial it (nil: plain TCP)

	stop struct {
		sync.Mutex
		done bool
		err  error
	}
}

// Broker is one broker of a Cluster: a master (Cluster.Brokers) or a
// slave of one (Broker.Slaves).
type Broker struct {
	cl     *Cluster
	name   string
	key    string // BrokerName(i) (slaves: plus "-s" and the id): the broker's key in the hook table
	id     int64  // 0 for a master
	opts   []broker.Option
	slaves []*Broker

	mu struct {
		sync.Mutex
		b       *broker.Broker
		stopped bool // by Close or Shutdown
	}
}

// Start starts a name server and the brokers opts ask for (one by default)
// on loopback, free ports, with their data in a temporary directory, waits
// until the name server lists every broker (so that their topics, the
// default topic TBW102 included, are routable) and creates the WithTopic
// topics. ctx bounds the start and the waits. On error nothing is left
// running.
func Start(ctx context.Context, opts ...Option) (cl *Cluster, err error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	cl = &Cluster{cfg: cfg, dir: cfg.dataDir}
	if cl.dir == "" && cfg.brokers > 0 {
		if cl.dir, err = os.MkdirTemp("", "runnel-embedded-"); err != nil {
			return nil, fmt.Errorf("embedded: %w", err)
		}
		cl.ownDir = true
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, cl.Close())
			cl = nil
		}
	}()
	if err := cl.startNameServer(ctx); err != nil {
		return cl, err
	}
	for i := range cfg.brokers {
		if err := cl.startBroker(ctx, i); err != nil {
			return cl, err
		}
	}
	if cl.c, err = client.New(cl.clientOptions(true)...); err != nil {
		return cl, fmt.Errorf("embedded: client: %w", err)
	}
	if cl.ns != nil && len(cl.brokers) > 0 {
		if err := cl.waitRegistered(ctx); err != nil {
			return cl, err
		}
	}
	for _, t := range cfg.topics {
		if err := cl.CreateTopic(ctx, t.name, t.queues); err != nil {
			return cl, err
		}
	}
	return cl, nil
}

func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	switch {
	case c.brokers < 0:
		return bad("%d brokers", c.brokers)
	case c.brokers == 0 && len(c.external) > 0:
		return bad("no broker and external name servers: nothing to run")
	case c.brokers == 0 && len(c.topics) > 0:
		return bad("topics without a broker")
	case c.policy != nil && len(c.external) == 0 && c.brokers > 0 && (c.admin.AccessKey == "" || c.admin.SecretKey == ""):
		return bad("WithACL needs the admin credentials the brokers sign their registrations with")
	case c.tlsMode != acl.TLSDisabled && c.tlsConfig == nil:
		return bad("TLS mode %s without a configuration", c.tlsMode)
	case c.tlsMode == acl.TLSEnforcing && len(c.tlsConfig.Certificates) == 0:
		return bad("enforcing TLS with a configuration holding no certificate")
	case c.slaves < 0 || c.slaves > 16:
		return bad("%d slaves per broker outside [0, 16]", c.slaves)
	case c.slaves > 0 && c.masterRole == broker.RoleSlave:
		return bad("WithSlaves: the masters' role must be a master's")
	}
	for _, t := range c.topics {
		if t.queues < 1 || t.queues > broker.MaxQueueNums {
			return bad("topic %q with %d queues", t.name, t.queues)
		}
	}
	return nil
}

func (cl *Cluster) startNameServer(ctx context.Context) error {
	cfg := &cl.cfg
	if len(cfg.external) > 0 {
		cl.nsAddrs = cfg.external
		return nil
	}
	opts := []namesrv.Option{
		namesrv.WithListenAddr(cfg.nsListen),
		namesrv.WithLogger(cfg.log.With("component", "namesrv")),
		namesrv.WithACL(cfg.policy),
		namesrv.WithTLS(cfg.tlsMode, cfg.tlsConfig),
	}
	if cfg.dataDir != "" {
		opts = append(opts, namesrv.WithKVConfigDir(filepath.Join(cfg.dataDir, "namesrv")))
	}
	ns, err := namesrv.New(append(opts, cfg.nsOpts...)...)
	if err != nil {
		return err
	}
	if err := ns.Start(ctx); err != nil {
		return errors.Join(fmt.Errorf("embedded: name server: %w", err), ns.Close())
	}
	cl.ns, cl.nsAddrs = ns, []string{ns.Addr()}
	if cfg.tlsMode == acl.TLSEnforcing {
		cl.nsTLS = pinnedTLS(cfg.tlsConfig)
	}
	return nil
}

func (cl *Cluster) startBroker(ctx context.Context, i int) error {
	cfg := &cl.cfg
	name := BrokerName(i)
	m := &Broker{cl: cl, name: name, key: name, opts: cl.brokerOptions(name, name, 0)}
	if err := m.Start(ctx); err != nil {
		return err
	}
	cl.brokers = append(cl.brokers, m)
	for id := int64(1); id <= int64(cfg.slaves); id++ {
		key := name + "-s" + strconv.FormatInt(id, 10)
		s := &Broker{cl: cl, name: name, key: key, id: id, opts: cl.brokerOptions(name, key, id)}
		if err := s.Start(ctx); err != nil {
			return err
		}
		m.slaves = append(m.slaves, s)
	}
	return nil
}

// brokerOptions returns the options of broker id of name (its data in
// dir/key).
func (cl *Cluster) brokerOptions(name, key string, id int64) []broker.Option {
	cfg := &cl.cfg
	log := cfg.log.With("component", "broker")
	if cfg.brokers > 1 || cfg.slaves > 0 {
		log = log.With("broker", key)
	}
	opts := []broker.Option{
		broker.WithListenAddr(DefaultListenAddr),
		broker.WithDataDir(filepath.Join(cl.dir, key)),
		broker.WithBrokerName(name),
		broker.WithClusterName(cfg.cluster),
		broker.WithNameServers(cl.nsAddrs...),
		broker.WithFlushMode(cfg.flush),
		broker.WithLogger(log),
		broker.WithACL(cfg.policy),
		broker.WithTLS(cfg.tlsMode, cfg.tlsConfig),
		broker.WithRemotingOptions(remoting.WithInterceptor(cl.hooks.interceptor(key))),
	}
	switch {
	case id > 0:
		opts = append(opts, broker.WithRole(broker.RoleSlave), broker.WithBrokerID(id))
	case cfg.slaves > 0:
		opts = append(opts, broker.WithRole(cfg.masterRole))
	}
	if cfg.admin.AccessKey != "" {
		opts = append(opts, broker.WithNameServerCredentials(cfg.admin))
	}
	if cl.nsTLS != nil {
		opts = append(opts, broker.WithNameServerTLS(cl.nsTLS))
	}
	return append(opts, cfg.brokerOpts...)
}

// Start starts the broker again after its Close or Shutdown, on its data
// directory (and, with its listen port 0, on another free port; the name
// server tells clients). ctx bounds the start. Starting a broker that was
// not stopped with Close or Shutdown fails.
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.b != nil && !b.mu.stopped {
		return fmt.Errorf("embedded: broker %s is running", b.key)
	}
	nb, err := broker.New(b.opts...)
	if err != nil {
		return err
	}
	if err := nb.Start(ctx); err != nil {
		return errors.Join(fmt.Errorf("embedded: broker %s: %w", b.key, err), nb.Close())
	}
	b.mu.b, b.mu.stopped = nb, false
	return nil
}

// Close stops the broker at once (broker.Broker.Close: as a crash of its
// process, its store closed); Start starts it again. Idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.stopped = true
	return b.mu.b.Close()
}

// Shutdown stops the broker gracefully (broker.Broker.Shutdown); Start
// starts it again.
func (b *Broker) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.stopped = true
	return b.mu.b.Shutdown(ctx)
}

// ID returns the broker's id: 0 for a master, 1… for its slaves.
func (b *Broker) ID() int64 { return b.id }

// Slaves returns a master's slaves (none for a slave, or without
// WithSlaves).
func (b *Broker) Slaves() []*Broker { return append([]*Broker(nil), b.slaves...) }

// pinnedTLS is a client configuration that accepts exactly the certificate
// of the server configuration srv (a client of this process's own name
// server and brokers needs no CA, and the certificate need not name
// 127.0.0.1), presenting it as client certificate when srv asks clients for
// one.
func pinnedTLS(srv *tls.Config) *tls.Config {
	der := srv.Certificates[0].Certificate[0]
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Chain and host name checks are replaced by the exact comparison
		// below, which is stricter.
		InsecureSkipVerify: true, //nolint:gosec // pinned in VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], der) {
				return errors.New("embedded: the server did not present the cluster's certificate")
			}
			return nil
		},
	}
	if srv.ClientAuth != tls.NoClientCert {
		cfg.Certificates = srv.Certificates
	}
	return cfg
}

// waitRegistered polls the name server until it lists every broker's
// advertised address as a master (and each slave's under its id), and
// takes the broker names from its listing (a WithBrokerOptions
// broker.WithBrokerName may have renamed them); with slaves it waits too
// until a slave of each master is connected to it. A broker registers its
// whole topic table at once, so from then on every topic it had at start
// is routable.
func (cl *Cluster) waitRegistered(ctx context.Context) error {
	var last error
	for {
		ci, err := cl.c.ClusterInfo(ctx)
		if err == nil {
			names := make(map[string]string, len(ci.BrokerAddrTable)) // master address → name
			ids := map[string]int64{}                                 // address → id
			for name, bd := range ci.BrokerAddrTable {
				names[bd.MasterAddr()] = name
				for id, a := range bd.BrokerAddrs {
					ids[a] = id
				}
			}
			for _, b := range cl.brokers {
				addr := b.Server().AdvertisedAddr()
				if _, ok := names[addr]; !ok {
					err = fmt.Errorf("the name server does not list broker %s at %s yet", b.name, addr)
					break
				}
				for _, s := range b.slaves {
					if id, ok := ids[s.Server().AdvertisedAddr()]; !ok || id != s.id {
						err = fmt.Errorf("the name server does not list slave %s yet", s.key)
						break
					}
				}
				if len(b.slaves) > 0 && len(b.Server().HAStatus().Slaves) == 0 {
					err = fmt.Errorf("no slave of %s is connected to it yet", b.name)
				}
				if err != nil {
					break
				}
			}
			if err == nil {
				for _, b := range cl.brokers {
					b.name = names[b.Server().AdvertisedAddr()]
					for _, s := range b.slaves {
						s.name = b.name
					}
				}
				return nil
			}
		}
		last = err
		if err := sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("embedded: waiting for the brokers' registration: %w (last: %w)", err, last)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// clientOptions returns the options of a client of the cluster: its name
// servers, client IP 127.0.0.1, TLS pinned to the cluster's certificate
// when it enforces TLS and, when admin is set, the WithACL admin
// credentials.
func (cl *Cluster) clientOptions(admin bool) []client.Option {
	opts := []client.Option{client.WithNameServers(cl.nsAddrs...), client.WithClientIP(netip.AddrFrom4([4]byte{127, 0, 0, 1}))}
	if cl.cfg.tlsMode == acl.TLSEnforcing {
		opts = append(opts, client.WithTLSConfig(pinnedTLS(cl.cfg.tlsConfig)))
	}
	if admin && cl.cfg.policy != nil && cl.cfg.admin.AccessKey != "" {
		opts = append(opts, client.WithCredentials(client.Credentials{AccessKey: cl.cfg.admin.AccessKey, SecretKey: cl.cfg.admin.SecretKey}))
	}
	return opts
}

// ClientOptions returns the client options that reach the cluster: its
// name server addresses, client IP 127.0.0.1 and, when it enforces TLS, a
// TLS configuration pinned to its certificate. ACL credentials are not
// included: add client.WithCredentials of the account to use.
func (cl *Cluster) ClientOptions() []client.Option { return cl.clientOptions(false) }

// NewClient returns a new client of the cluster (ClientOptions, then opts).
// The caller closes it, before the cluster.
func (cl *Cluster) NewClient(opts ...client.Option) (*client.Client, error) {
	return client.New(append(cl.ClientOptions(), opts...)...)
}

// Client returns the cluster's own client (ClientOptions, signed with the
// WithACL admin account when there is one), for producing, consuming and
// administration in tests. The cluster closes it: do not.
func (cl *Cluster) Client() *client.Client { return cl.c }

// NameServer returns the address ("ip:port") of the cluster's name server,
// or with WithExternalNameServers the first of those.
func (cl *Cluster) NameServer() string { return cl.nsAddrs[0] }

// NameServerAddrs returns every name server address the brokers register
// with.
func (cl *Cluster) NameServerAddrs() []string { return append([]string(nil), cl.nsAddrs...) }

// Namesrv returns the cluster's name server (nil with
// WithExternalNameServers).
func (cl *Cluster) Namesrv() *namesrv.Server { return cl.ns }

// Brokers returns the cluster's brokers, in the order of their names.
func (cl *Cluster) Brokers() []*Broker { return append([]*Broker(nil), cl.brokers...) }

// Broker returns broker i (0 ≤ i < the WithBrokers count).
func (cl *Cluster) Broker(i int) *Broker { return cl.brokers[i] }

// BrokerAddr returns the address broker 0 listens on (the cluster must
// have a broker).
func (cl *Cluster) BrokerAddr() string { return cl.brokers[0].Server().Addr() }

// DataDir returns the directory holding the cluster's data: WithDataDir's,
// or the temporary one Start made ("" for a name server alone without
// WithDataDir, which keeps its KV config in memory).
func (cl *Cluster) DataDir() string { return cl.dir }

// Name returns the broker's name: BrokerName(i), or the name the name
// server lists it under when a WithBrokerOptions broker.WithBrokerName
// renamed it (with WithExternalNameServers, BrokerName(i) always).
func (b *Broker) Name() string { return b.name }

// Addr returns the address ("ip:port") the broker listens on.
func (b *Broker) Addr() string { return b.Server().Addr() }

// Server returns the running broker (its statistics, Shutdown, …): after
// Start, the new one.
func (b *Broker) Server() *broker.Broker {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.b
}

// Control registers fn for the next request with the given code (or
// AnyCode) that reaches any broker of the cluster: fn runs once, for that
// request, and is removed whatever it returns (see the fault hooks in the
// package documentation).
func (cl *Cluster) Control(code int32, fn remoting.ControlFunc) { cl.hooks.add("", code, fn, false) }

// KeepControl registers fn for every request with the given code (or
// AnyCode) to any broker of the cluster, until remove is called.
func (cl *Cluster) KeepControl(code int32, fn remoting.ControlFunc) (remove func()) {
	id := cl.hooks.add("", code, fn, true)
	return func() { cl.hooks.remove(id) }
}

// Control registers fn for the next request with the given code (or
// AnyCode) to this broker, as Cluster.Control does for any broker.
func (b *Broker) Control(code int32, fn remoting.ControlFunc) {
	b.cl.hooks.add(b.key, code, fn, false)
}

// KeepControl registers fn for every request with the given code (or
// AnyCode) to this broker, until remove is called.
func (b *Broker) KeepControl(code int32, fn remoting.ControlFunc) (remove func()) {
	id := b.cl.hooks.add(b.key, code, fn, true)
	return func() { b.cl.hooks.remove(id) }
}

// CreateTopic creates topic with queues read and write queues on every
// broker of the cluster (UPDATE_AND_CREATE_TOPIC, or an update of an
// existing topic) and waits until the name server's route of it shows
// queues publish and queues subscribe queues on each, so that producers and
// sources find them at once. ctx bounds it.
func (cl *Cluster) CreateTopic(ctx context.Context, topic string, queues int) error {
	if len(cl.brokers) == 0 {
		return errors.New("embedded: create topic: the cluster has no broker")
	}
	tc := client.TopicConfig{TopicName: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues)}
	for _, b := range cl.brokers {
		if err := cl.c.CreateTopic(ctx, b.Server().AdvertisedAddr(), tc); err != nil {
			return fmt.Errorf("embedded: %w", err)
		}
	}
	var last error
	for {
		r, err := cl.c.RefreshRoute(ctx, topic)
		if err == nil {
			err = routable(r, cl.brokers, queues)
			if err == nil {
				return nil
			}
		}
		last = err
		if err := sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("embedded: waiting for the route of %s: %w (last: %w)", topic, err, last)
		}
	}
}

// routable checks that r has queues publish and subscribe queues on each
// broker of bs.
func routable(r *client.TopicRoute, bs []*Broker, queues int) error {
	pub, sub := map[string]int{}, map[string]int{}
	for _, q := range r.PublishQueues() {
		pub[q.BrokerName]++
	}
	for _, q := range r.SubscribeQueues() {
		sub[q.BrokerName]++
	}
	for _, b := range bs {
		if pub[b.name] != queues || sub[b.name] != queues {
			return fmt.Errorf("route has %d publish and %d subscribe queues on %s, want %d", pub[b.name], sub[b.name], b.name, queues)
		}
	}
	return nil
}

// Messages returns the messages topic holds now (committed ones: half
// messages of open transactions are not in it), queue by queue in the
// order of the topic's route (broker name, then queue id), each queue from
// its min offset in offset order. Bodies and properties are copies. It is
// meant for checking a job's output in tests; ctx bounds it.
func (cl *Cluster) Messages(ctx context.Context, topic string) ([]protocol.MessageExt, error) {
	r, err := cl.c.RefreshRoute(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("embedded: messages of %s: %w", topic, err)
	}
	var out []protocol.MessageExt
	for _, q := range r.SubscribeQueues() {
		off, err := cl.c.MinOffset(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("embedded: messages of %s: %w", q, err)
		}
		end, err := cl.c.MaxOffset(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("embedded: messages of %s: %w", q, err)
		}
		for off < end {
			res, err := cl.c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, Group: readerGroup, MaxMsgs: 32})
			if err != nil {
				return nil, fmt.Errorf("embedded: messages of %s: %w", q, err)
			}
			if res.Status != client.PullFound || res.NextBeginOffset <= off {
				break
			}
			for i := range res.Messages {
				if res.Messages[i].QueueOffset < end {
					out = append(out, res.Messages[i].Clone())
				}
			}
			off = res.NextBeginOffset
		}
	}
	return out, nil
}

// readerGroup is the consumer group Messages pulls as (it commits no
// offset).
const readerGroup = "runnel_embedded_reader"

// Close stops the cluster at once: its client, then the brokers
// (broker.Broker.Close), then the name server, joining their goroutines, and
// removes the temporary data directory if Start made one. It is idempotent
// and returns the first call's result; after Shutdown it returns
// Shutdown's.
func (cl *Cluster) Close() error { return cl.halt(nil) }

// Shutdown stops the cluster gracefully: its client, then the brokers
// (broker.Broker.Shutdown: sends refused, parked pulls answered, the name
// server told), then the name server, and removes the temporary data
// directory. When ctx ends first the rest is stopped at once and ctx's
// error is returned with any other. Later calls, and Close, return the
// first call's result.
func (cl *Cluster) Shutdown(ctx context.Context) error { return cl.halt(ctx) }

func (cl *Cluster) halt(ctx context.Context) error {
	cl.stop.Lock()
	defer cl.stop.Unlock()
	if cl.stop.done {
		return cl.stop.err
	}
	cl.stop.done = true
	var err error
	if cl.c != nil {
		err = cl.c.Close()
	}
	for i := len(cl.brokers) - 1; i >= 0; i-- {
		for _, b := range append(cl.brokers[i].Slaves(), cl.brokers[i]) {
			if ctx != nil {
				err = errors.Join(err, b.Shutdown(ctx))
			} else {
				err = errors.Join(err, b.Close())
			}
		}
	}
	if cl.ns != nil {
		if ctx != nil {
			err = errors.Join(err, cl.ns.Shutdown(ctx))
		} else {
			err = errors.Join(err, cl.ns.Close())
		}
	}
	if cl.ownDir {
		err = errors.Join(err, os.RemoveAll(cl.dir))
	}
	cl.stop.err = err
	return err
}

// EnsureTopic makes topic exist on a cluster reached through c, for
// programs that run on an embedded cluster by default and on one run
// elsewhere when given its name server (runnel's examples do): unless c's
// name servers route topic already, it creates it with queues read and
// write queues on target (a broker address or a cluster name, as
// client.Client.CreateTopic takes) and waits until the route shows at
// least queues publish and subscribe queues. ctx bounds it. On an embedded
// cluster, Cluster.CreateTopic is simpler.
func EnsureTopic(ctx context.Context, c *client.Client, target, topic string, queues int) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := c.RefreshRoute(rctx, topic)
	cancel()
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, protocol.ErrTopicNotExist):
		return fmt.Errorf("embedded: route of %s: %w", topic, err)
	}
	if err := c.CreateTopic(ctx, target, client.TopicConfig{TopicName: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues)}); err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	var last error
	for {
		r, err := c.RefreshRoute(ctx, topic)
		if err == nil {
			if len(r.PublishQueues()) >= queues && len(r.SubscribeQueues()) >= queues {
				return nil
			}
			err = fmt.Errorf("route has %d publish and %d subscribe queues, want %d", len(r.PublishQueues()), len(r.SubscribeQueues()), queues)
		}
		last = err
		if err := sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("embedded: waiting for the route of %s: %w (last: %w)", topic, err, last)
		}
	}
}
