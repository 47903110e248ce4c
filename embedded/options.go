package embedded

import (
	"crypto/tls"
	"log/slog"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/namesrv"
)

// Defaults of the options below.
const (
	// DefaultListenAddr is where the name server and the brokers listen
	// unless told otherwise: loopback, a free port each.
	DefaultListenAddr = "127.0.0.1:0"
	// DefaultClusterName is the cluster the brokers join
	// (broker.DefaultClusterName).
	DefaultClusterName = broker.DefaultClusterName
)

// Option configures Start and Run. Options are applied in order; a later
// one overrides an earlier one of the same kind, except the pass-through
// options (WithBrokerOptions, WithNameServerOptions) and WithTopic, which
// add up.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type topicSpec struct {
	name   string
	queues int
}

type config struct {
	dataDir    string
	brokers    int
	cluster    string
	flush      broker.FlushMode
	nsListen   string
	external   []string
	policy     *acl.Policy
	admin      acl.Credentials
	tlsMode    acl.TLSMode
	tlsConfig  *tls.Config
	log        *slog.Logger
	brokerOpts []broker.Option
	nsOpts     []namesrv.Option
	topics     []topicSpec
	slaves     int
	masterRole broker.Role
}

func defaultConfig() config {
	return config{brokers: 1, cluster: DefaultClusterName, flush: broker.FlushAsync, nsListen: DefaultListenAddr}
}

// WithBrokers sets how many brokers the cluster runs (default 1). They are
// named BrokerName(0), BrokerName(1), … ("broker-a", "broker-b", …), all
// masters of one cluster, each with its own data directory. 0 runs the name
// server alone.
func WithBrokers(n int) Option { return optionFunc(func(c *config) { c.brokers = n }) }

// WithClusterName sets the cluster the brokers join (DefaultClusterName).
func WithClusterName(name string) Option { return optionFunc(func(c *config) { c.cluster = name }) }

// WithFlushMode sets the brokers' flush mode. The default is
// broker.FlushAsync: the cluster lives and dies with this process, so the
// fsync before each acknowledgement of broker.FlushSync buys nothing
// against a crash of the process; it matters when the process outlives
// what it tests (a job killed in a child process does not take the broker
// with it either way) or runs as a standalone broker (`runnel broker`).
func WithFlushMode(m broker.FlushMode) Option { return optionFunc(func(c *config) { c.flush = m }) }

// WithDataDir keeps the cluster's data under dir: the name server's KV
// config in dir/namesrv, broker i's store in dir/BrokerName(i). A cluster
// started again on the same dir finds its topics, messages, offsets and KV
// config. Without it the brokers store in a temporary directory that Close
// removes (Run: in the test's TempDir) and the name server keeps its KV
// config in memory.
func WithDataDir(dir string) Option { return optionFunc(func(c *config) { c.dataDir = dir }) }

// WithNameServerAddr sets the address the name server listens on
// (DefaultListenAddr).
func WithNameServerAddr(addr string) Option { return optionFunc(func(c *config) { c.nsListen = addr }) }

// WithExternalNameServers runs no name server of its own: the brokers
// register with the name servers at addrs, and the cluster's client uses
// them. Start then does not wait for the registrations (the brokers retry
// them in the background while a name server cannot be reached).
func WithExternalNameServers(addrs ...string) Option {
	return optionFunc(func(c *config) { c.external = append([]string(nil), addrs...) })
}

// WithACL checks every request to the name server and the brokers with p
// (namesrv.WithACL, broker.WithACL). admin is an admin account of p: the
// brokers sign their registrations with it (the name server refuses
// unsigned ones) and the cluster's own client (Client, CreateTopic, the
// wait for registrations) signs its requests with it. It may be zero only
// with WithExternalNameServers or without brokers.
func WithACL(p *acl.Policy, admin acl.Credentials) Option {
	return optionFunc(func(c *config) { c.policy, c.admin = p, admin })
}

// WithTLS sets the TLS mode of the name server's and the brokers' ports
// (namesrv.WithTLS, broker.WithTLS), cfg being the server configuration
// (acl.ServerTLSConfig builds one from files). In acl.TLSEnforcing mode the
// brokers dial the cluster's name server over TLS, accepting exactly the
// certificate of cfg (so it need not name 127.0.0.1, and no CA is needed)
// and presenting it when cfg asks clients for certificates; ClientOptions
// and the cluster's client do the same.
func WithTLS(mode acl.TLSMode, cfg *tls.Config) Option {
	return optionFunc(func(c *config) { c.tlsMode, c.tlsConfig = mode, cfg })
}

// WithLogger sets the logger of the name server (with component=namesrv)
// and the brokers (component=broker, and broker=<name> when there are
// several). Default: logs are discarded.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.log = l }) }

// WithBrokerOptions passes opts to every broker's broker.New, after the
// cluster's own (listen address, data directory, name, cluster, name
// servers, flush mode, logger, ACL, TLS, fault hooks), so that they
// override them: broker.WithListenAddr or broker.WithDataDir here give
// every broker the same address or directory, which only makes sense with
// one broker. broker.WithRemotingOptions adds to the cluster's fault-hook
// interceptor rather than replacing it.
func WithBrokerOptions(opts ...broker.Option) Option {
	return optionFunc(func(c *config) { c.brokerOpts = append(c.brokerOpts, opts...) })
}

// WithNameServerOptions passes opts to the name server's namesrv.New, after
// the cluster's own (listen address, KV config directory, logger, ACL,
// TLS), so that they override them.
func WithNameServerOptions(opts ...namesrv.Option) Option {
	return optionFunc(func(c *config) { c.nsOpts = append(c.nsOpts, opts...) })
}

// WithTopic creates topic with queues read and write queues on every broker
// during Start, which returns once it is routable (see CreateTopic).
func WithTopic(topic string, queues int) Option {
	return optionFunc(func(c *config) { c.topics = append(c.topics, topicSpec{topic, queues}) })
}

// WithSlaves gives every broker n slaves (broker ids 1…n, the broker's name
// and cluster, each with its own data directory BrokerName(i)+"-s1", …)
// that replicate it (package broker, "High availability"); the masters
// take role, broker.RoleSyncMaster or broker.RoleAsyncMaster. The slaves
// learn their master from the name server. Start returns once the name
// server lists every master and slave, and a slave of each master is
// connected to it. Broker.Slaves returns them; Cluster.Brokers the masters.
func WithSlaves(n int, role broker.Role) Option {
	return optionFunc(func(c *config) { c.slaves, c.masterRole = n, role })
}
