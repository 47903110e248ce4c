package namesrv

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Defaults of the options below.
const (
	// DefaultListenAddr is the name server's default address (RocketMQ's
	// port 9876, bound to loopback).
	DefaultListenAddr = "127.0.0.1:9876"
	// DefaultBrokerExpiry is how long a broker registration stays valid when
	// the broker does not say (Java DEFAULT_BROKER_CHANNEL_EXPIRED_TIME).
	DefaultBrokerExpiry = 120 * time.Second
	// DefaultScanInterval is how often expired brokers are looked for (Java
	// scanNotActiveBrokerInterval).
	DefaultScanInterval = 5 * time.Second
)

// Option configures New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	listenAddr   string
	logger       *slog.Logger
	brokerExpiry time.Duration
	scanInterval time.Duration
	now          func() time.Time
	kvDir        string
	allTopicList bool
	orderMessage bool
	remotingOpts []remoting.ServerOption
	policy       *acl.Policy
	tlsMode      acl.TLSMode
	tlsConfig    *tls.Config
}

func defaultConfig() config {
	return config{
		listenAddr:   DefaultListenAddr,
		brokerExpiry: DefaultBrokerExpiry,
		scanInterval: DefaultScanInterval,
		now:          time.Now,
		allTopicList: true,
	}
}

func (c *config) validate() error {
	switch {
	case c.listenAddr == "":
		return errors.New("namesrv: empty listen address")
	case c.brokerExpiry <= 0:
		return fmt.Errorf("namesrv: broker expiry %v is not positive", c.brokerExpiry)
	case c.scanInterval <= 0:
		return fmt.Errorf("namesrv: scan interval %v is not positive", c.scanInterval)
	case c.now == nil:
		return errors.New("namesrv: nil clock")
	}
	if _, err := acl.TLSServerOptions(c.tlsMode, c.tlsConfig); err != nil {
		return fmt.Errorf("namesrv: %w", err)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// WithListenAddr sets the TCP address Start listens on, "host:port"
// (DefaultListenAddr; port 0 picks a free port, see Server.Addr).
func WithListenAddr(addr string) Option {
	return optionFunc(func(c *config) { c.listenAddr = addr })
}

// WithLogger sets the logger; nil (the default) discards. Registrations and
// evictions are logged at Info, refreshes and rejected requests at Debug.
// The logger is also given to the remoting server.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithBrokerExpiry sets how long a registration stays valid when the broker
// sends no heartbeatTimeoutMillis (DefaultBrokerExpiry).
func WithBrokerExpiry(d time.Duration) Option {
	return optionFunc(func(c *config) { c.brokerExpiry = d })
}

// WithScanInterval sets how often expired registrations are evicted
// (DefaultScanInterval).
func WithScanInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.scanInterval = d })
}

// WithClock sets the clock that registration times and expiry are measured
// with (time.Now by default); tests use it to expire brokers without
// waiting. The scan interval is always measured in real time. now must be
// safe for concurrent use.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}

// WithKVConfigDir persists the KV config in dir/kvConfig.json (Java's
// format, {"configTable":{namespace:{key:value}}}), loading it in New. By
// default the KV config lives in memory only.
func WithKVConfigDir(dir string) Option {
	return optionFunc(func(c *config) { c.kvDir = dir })
}

// WithAllTopicList enables or disables GET_ALL_TOPIC_LIST_FROM_NAMESERVER
// (Java enableAllTopicList; enabled by default). Disabled, it is answered
// SYSTEM_ERROR "disable".
func WithAllTopicList(enabled bool) Option {
	return optionFunc(func(c *config) { c.allTopicList = enabled })
}

// WithOrderMessage makes routes carry orderTopicConf from the KV namespace
// ORDER_TOPIC_CONFIG (Java orderMessageEnable; disabled by default).
func WithOrderMessage(enabled bool) Option {
	return optionFunc(func(c *config) { c.orderMessage = enabled })
}

// WithRemotingOptions passes options to the underlying remoting.Server
// (frame size limit, idle timeout, TLS, …). WithLogger is applied before
// them.
func WithRemotingOptions(opts ...remoting.ServerOption) Option {
	return optionFunc(func(c *config) { c.remotingOpts = append(c.remotingOpts, opts...) })
}

// WithACL makes the name server check every request with p (see package
// acl): requests must be signed by an account of p, registration and
// administration codes (REGISTER_BROKER, UNREGISTER_BROKER, KV writes,
// DELETE_TOPIC_IN_NAMESRV, …) need an admin account, routes need PUB or SUB
// on the topic, and codes p does not know are refused, all with
// NO_PERMISSION before any handler runs. Brokers registering with such a
// name server must sign their requests with an admin account.
// UPDATE_NAMESRV_CONFIG stays refused, even to admins. p may be reloaded
// while the server runs (p.Reload). A nil p leaves ACL off.
func WithACL(p *acl.Policy) Option {
	return optionFunc(func(c *config) { c.policy = p })
}

// WithTLS sets the TLS mode of the name server port: acl.TLSDisabled (the
// default; cfg is ignored), acl.TLSPermissive (TLS and plain TCP on one
// port) or acl.TLSEnforcing (TLS only), with cfg the server configuration
// (acl.ServerTLSConfig builds it from files). New fails when a mode other
// than disabled comes without cfg.
func WithTLS(mode acl.TLSMode, cfg *tls.Config) Option {
	return optionFunc(func(c *config) { c.tlsMode, c.tlsConfig = mode, cfg })
}
