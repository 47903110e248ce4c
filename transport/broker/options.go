package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Defaults of the options below.
const (
	// DefaultListenAddr is RocketMQ's broker port on the loopback interface.
	DefaultListenAddr = "127.0.0.1:10911"
	// DefaultBrokerName is the broker name when none is given.
	DefaultBrokerName = "broker-a"
	// DefaultClusterName is the cluster name when none is given.
	DefaultClusterName = "DefaultCluster"
	// DefaultTopicQueueNums is the queue count of TBW102 and the cap of the
	// queue count of auto-created topics (Java defaultTopicQueueNums).
	DefaultTopicQueueNums = 8
	// DefaultMaxMessageSize bounds a message body (Java maxMessageSize).
	DefaultMaxMessageSize = 4 << 20
	// DefaultMaxSuspend caps how long a pull is parked, below the 30 s
	// client timeout of the Go and Java clients.
	DefaultMaxSuspend = 25 * time.Second
	// DefaultMaxParkedPulls bounds the pulls parked at once.
	DefaultMaxParkedPulls = 16384
	// DefaultPullMaxMsgs and DefaultPullMaxBytes cap one pull response
	// (Java maxTransferCountOnMessageInMemory / maxTransferBytesOnMessageInMemory).
	DefaultPullMaxMsgs  = 32
	DefaultPullMaxBytes = 256 << 10
	// DefaultRegisterInterval is the period of the full REGISTER_BROKER to
	// every name server (Java registerNameServerPeriod).
	DefaultRegisterInterval = 30 * time.Second
	// MaxQueueNums bounds the queue count of one topic.
	MaxQueueNums = 1024
	// DefaultTransactionCheckInterval is the period of the transaction
	// check-back scan (Java transactionCheckInterval).
	DefaultTransactionCheckInterval = 30 * time.Second
	// DefaultTransactionTimeout is the age a half message must reach
	// before it is checked back (Java transactionTimeOut).
	DefaultTransactionTimeout = 6 * time.Second
	// DefaultDiskHighWatermark is the disk usage fraction above which sends
	// are refused (Java's diskSpaceWarningLevelRatio).
	DefaultDiskHighWatermark = 0.90
	// DefaultMaxBatchMessages bounds the messages of one SEND_BATCH_MESSAGE.
	DefaultMaxBatchMessages = 4096
	// DefaultMaxBatchBytes bounds the body of one SEND_BATCH_MESSAGE (Java
	// applies maxMessageSize, 4 MiB, to the whole batch body).
	DefaultMaxBatchBytes = 4 << 20
	// DefaultTransactionCheckMax is the number of check-backs after which
	// a half message is discarded to TRANS_CHECK_MAX_TIME_TOPIC (Java
	// transactionCheckMax).
	DefaultTransactionCheckMax = 15
)

// FlushMode selects when a send is answered relative to fsync.
type FlushMode int

const (
	// FlushSync (default) answers a send after the message was fsynced;
	// concurrent sends share one fsync (group commit).
	FlushSync FlushMode = iota
	// FlushAsync answers once the message is readable; the store fsyncs in
	// the background (every 500 ms). A machine crash can lose the last few
	// hundred milliseconds of acknowledged messages; a process crash
	// (kill -9) can too, up to the 32 KiB the store's WAL writer buffers in
	// memory between syncs (RocketMQ's ASYNC flush loses nothing on a
	// process crash: use FlushSync where that matters). A failed WAL write or fsync
	// makes the broker refuse sends ([STORE_FAILED]) until it restarts, as
	// in FlushSync mode; the messages acknowledged since the last fsync may
	// then be lost as in a machine crash.
	FlushAsync
)

// String returns "sync" or "async", the names `runnel broker --flush` takes.
func (m FlushMode) String() string {
	switch m {
	case FlushSync:
		return "sync"
	case FlushAsync:
		return "async"
	}
	return "FlushMode(" + strconv.Itoa(int(m)) + ")"
}

// Option configures New. Options are applied in order.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is the validated configuration of a Broker.
type config struct {
	listenAddr       string
	advertised       string
	dataDir          string
	nameServers      []string
	brokerName       string
	clusterName      string
	flushMode        FlushMode
	autoCreateTopics bool
	autoCreateGroups bool
	topicQueueNums   int
	logger           *slog.Logger
	clock            func() time.Time
	maxMessageSize   int
	maxSuspend       time.Duration
	maxParked        int
	pullMaxMsgs      int
	pullMaxBytes     int
	registerInterval time.Duration
	remotingOpts     []remoting.ServerOption
	policy           *acl.Policy
	tlsMode          acl.TLSMode
	tlsConfig        *tls.Config
	nsCreds          *acl.Credentials // signs requests to name servers when set
	nsTLS            *tls.Config      // dials name servers over TLS when set
	sub              subsystemConfig
	tx               txConfig
	filter           filterConfig // filter.go
	pop              popConfig    // pop.go
	diskHighWater    float64
	retention        time.Duration // retention.go
	maxBatchMsgs     int
	maxBatchBytes    int
	ha               haConfig // ha.go
	conflictGrace    time.Duration
	// storeHook, set by tests only, adjusts the store's options.
	storeHook func(*store.Options)
}

// txConfig holds the transaction check-back knobs (transaction.go).
type txConfig struct {
	checkInterval time.Duration // real-time period of the check-back scan
	timeout       time.Duration // half messages younger than this (broker clock) are not checked
	checkMax      int           // check-backs before a half message is discarded
	halfCache     int           // bytes of pending half messages' records kept in memory
}

func defaultConfig() config {
	return config{
		listenAddr:       DefaultListenAddr,
		brokerName:       DefaultBrokerName,
		clusterName:      DefaultClusterName,
		flushMode:        FlushSync,
		autoCreateTopics: true,
		autoCreateGroups: true,
		topicQueueNums:   DefaultTopicQueueNums,
		clock:            time.Now,
		maxMessageSize:   DefaultMaxMessageSize,
		maxSuspend:       DefaultMaxSuspend,
		maxParked:        DefaultMaxParkedPulls,
		pullMaxMsgs:      DefaultPullMaxMsgs,
		pullMaxBytes:     DefaultPullMaxBytes,
		registerInterval: DefaultRegisterInterval,
		diskHighWater:    DefaultDiskHighWatermark,
		retention:        DefaultRetention,
		maxBatchMsgs:     DefaultMaxBatchMessages,
		maxBatchBytes:    DefaultMaxBatchBytes,
		sub:              defaultSubsystemConfig(),
		ha:               defaultHAConfig(),
		conflictGrace:    defaultConflictGrace,
		tx: txConfig{
			checkInterval: DefaultTransactionCheckInterval,
			timeout:       DefaultTransactionTimeout,
			checkMax:      DefaultTransactionCheckMax,
			halfCache:     DefaultTransactionHalfCache,
		},
	}
}

// ErrInvalidOption is wrapped by New's errors for a bad option.
var ErrInvalidOption = errors.New("broker: invalid option")

func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	switch {
	case c.dataDir == "":
		return bad("data dir is required")
	case c.flushMode != FlushSync && c.flushMode != FlushAsync:
		return bad("flush mode %d", c.flushMode)
	case validateName(c.brokerName, maxTopicLen) != nil:
		return bad("broker name %q", c.brokerName)
	case validateName(c.clusterName, maxTopicLen) != nil:
		return bad("cluster name %q", c.clusterName)
	case c.topicQueueNums < 1 || c.topicQueueNums > MaxQueueNums:
		return bad("default topic queue nums %d outside [1, %d]", c.topicQueueNums, MaxQueueNums)
	case c.maxMessageSize < 1 || c.maxMessageSize > 64<<20:
		return bad("max message size %d outside [1, 64 MiB]", c.maxMessageSize)
	case c.maxSuspend < 0 || c.maxSuspend >= 30*time.Second:
		return bad("max suspend %v outside [0, 30s)", c.maxSuspend)
	case c.maxParked < 0:
		return bad("max parked pulls %d", c.maxParked)
	case c.pullMaxMsgs < 1 || c.pullMaxMsgs > 1<<16:
		return bad("pull max messages %d", c.pullMaxMsgs)
	case c.pullMaxBytes < 1 || c.pullMaxBytes > 128<<20:
		return bad("pull max bytes %d", c.pullMaxBytes)
	case !(c.diskHighWater > 0 && c.diskHighWater <= 1): // also NaN
		return bad("disk high-water mark %v outside (0, 1]", c.diskHighWater)
	case c.maxBatchMsgs < 1 || c.maxBatchMsgs > maxBatchItems:
		return bad("max batch messages %d outside [1, %d]", c.maxBatchMsgs, maxBatchItems)
	case c.maxBatchBytes < 1 || c.maxBatchBytes > 64<<20:
		return bad("max batch bytes %d outside [1, 64 MiB]", c.maxBatchBytes)
	case c.registerInterval < 100*time.Millisecond:
		return bad("register interval %v below 100ms", c.registerInterval)
	case c.clock == nil:
		return bad("nil clock")
	case c.sub.channelExpiry <= 0 || c.sub.channelScan <= 0:
		return bad("client expiry %v / scan %v must be positive", c.sub.channelExpiry, c.sub.channelScan)
	case c.sub.lockExpiry <= 0:
		return bad("lock expiry %v must be positive", c.sub.lockExpiry)
	case c.sub.timerMaxDelay <= 0:
		return bad("timer max delay %v must be positive", c.sub.timerMaxDelay)
	case len(c.sub.delayLevels) == 0 || len(c.sub.delayLevels) > scheduleQueueNums:
		return bad("%d delay levels outside [1, %d]", len(c.sub.delayLevels), scheduleQueueNums)
	case c.tx.checkInterval < 10*time.Millisecond:
		return bad("transaction check interval %v below 10ms", c.tx.checkInterval)
	case c.tx.timeout < 0:
		return bad("negative transaction timeout %v", c.tx.timeout)
	case c.tx.checkMax < 1:
		return bad("transaction check max %d below 1", c.tx.checkMax)
	case c.tx.halfCache < 0:
		return bad("negative transaction half cache %d", c.tx.halfCache)
	case c.retention < 0:
		return bad("negative retention %v", c.retention)
	}
	if err := c.ha.validate(); err != nil {
		return err
	}
	for i, d := range c.sub.delayLevels {
		if d <= 0 {
			return bad("delay level %d is %v, must be positive", i+1, d)
		}
	}
	// The housekeeping loop must wake often enough for short expiries.
	c.sub.housekeepTick = min(c.sub.housekeepTick, c.sub.channelScan, c.sub.lockExpiry)
	if _, _, err := net.SplitHostPort(c.listenAddr); err != nil {
		return bad("listen address %q: %v", c.listenAddr, err)
	}
	if c.advertised != "" {
		if _, err := netip.ParseAddrPort(c.advertised); err != nil {
			return bad("advertised address %q must be ip:port: %v", c.advertised, err)
		}
	}
	if c.nsCreds != nil && (c.nsCreds.AccessKey == "" || c.nsCreds.SecretKey == "") {
		return bad("name server credentials need an access key and a secret key")
	}
	tlsOpts, err := acl.TLSServerOptions(c.tlsMode, c.tlsConfig)
	if err != nil {
		return bad("%v", err)
	}
	// Security options go first, so that the ACL interceptor judges a
	// request before any interceptor passed with WithRemotingOptions.
	var sec []remoting.ServerOption
	if c.policy != nil {
		sec = append(sec, c.policy.ServerOption())
	}
	c.remotingOpts = append(append(sec, tlsOpts...), c.remotingOpts...)
	for _, ns := range c.nameServers {
		if _, _, err := net.SplitHostPort(ns); err != nil {
			return bad("name server address %q: %v", ns, err)
		}
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// WithListenAddr sets the address to listen on ("host:port"; port 0 picks a
// free port, see Broker.Addr). Default DefaultListenAddr.
func WithListenAddr(addr string) Option { return optionFunc(func(c *config) { c.listenAddr = addr }) }

// WithAdvertisedAddr sets the "ip:port" clients are told to use: the
// brokerAddr registered with name servers and the store host inside
// message ids. Default: the address actually bound (an unspecified IP is
// replaced by a non-loopback IPv4 address of this host, or 127.0.0.1).
func WithAdvertisedAddr(addr string) Option {
	return optionFunc(func(c *config) { c.advertised = addr })
}

// WithDataDir sets the directory of the message store. Required.
func WithDataDir(dir string) Option { return optionFunc(func(c *config) { c.dataDir = dir }) }

// WithNameServers sets the name servers to register with ("host:port"
// each). None (the default) means the broker registers nowhere.
func WithNameServers(addrs ...string) Option {
	return optionFunc(func(c *config) { c.nameServers = append([]string(nil), addrs...) })
}

// WithBrokerName sets the broker name (default DefaultBrokerName).
func WithBrokerName(name string) Option { return optionFunc(func(c *config) { c.brokerName = name }) }

// WithClusterName sets the cluster name (default DefaultClusterName).
func WithClusterName(name string) Option {
	return optionFunc(func(c *config) { c.clusterName = name })
}

// WithFlushMode selects FlushSync (default) or FlushAsync.
func WithFlushMode(m FlushMode) Option { return optionFunc(func(c *config) { c.flushMode = m }) }

// WithAutoCreateTopics enables (default) or disables creating unknown
// topics on send from an inheritable default topic (TBW102). When disabled,
// TBW102 is not created at all.
func WithAutoCreateTopics(on bool) Option {
	return optionFunc(func(c *config) { c.autoCreateTopics = on })
}

// WithAutoCreateGroups enables (default) or disables creating unknown
// subscription groups on first use.
func WithAutoCreateGroups(on bool) Option {
	return optionFunc(func(c *config) { c.autoCreateGroups = on })
}

// WithDefaultTopicQueueNums sets the queue count of TBW102, which caps the
// queue count of auto-created topics (default 8).
func WithDefaultTopicQueueNums(n int) Option {
	return optionFunc(func(c *config) { c.topicQueueNums = n })
}

// WithLogger sets the logger; nil (the default) discards.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithClock sets the clock for store timestamps and metadata versions
// (default time.Now); for tests.
func WithClock(now func() time.Time) Option { return optionFunc(func(c *config) { c.clock = now }) }

// WithMaxMessageSize bounds a message body in bytes (default 4 MiB); larger
// sends get MESSAGE_ILLEGAL.
func WithMaxMessageSize(n int) Option { return optionFunc(func(c *config) { c.maxMessageSize = n }) }

// WithDiskHighWatermark sets the fraction of the data dir's file system
// (used / total, as df counts it) above which sends are refused with
// SERVICE_NOT_AVAILABLE and a remark starting "[DISK_FULL]"; they are
// accepted again by themselves once usage falls below it. Usage is read
// every second (statfs), and the bytes accepted in between are added to
// the last reading. Default DefaultDiskHighWatermark (0.90); 1 turns the
// check off; New fails outside (0, 1]. Consumer offsets and pulls are not
// affected.
func WithDiskHighWatermark(fraction float64) Option {
	return optionFunc(func(c *config) { c.diskHighWater = fraction })
}

// WithMaxBatch bounds one SEND_BATCH_MESSAGE: at most maxMsgs messages
// (default 4096, at most 65536) and a body of at most maxBytes (default
// 4 MiB, at most 64 MiB; each message's body is also bounded by
// WithMaxMessageSize). A larger batch is refused whole with
// MESSAGE_ILLEGAL, nothing stored. The remoting frame limit
// (remoting.WithMaxFrameSize) bounds the body too.
func WithMaxBatch(maxMsgs, maxBytes int) Option {
	return optionFunc(func(c *config) { c.maxBatchMsgs, c.maxBatchBytes = maxMsgs, maxBytes })
}

// WithLongPolling sets the cap on how long a pull is parked (default 25 s,
// must stay below the clients' 30 s timeout; 0 disables parking) and the
// most pulls parked at once (default 16384; a pull beyond it is answered
// SYSTEM_BUSY at once, which makes clients back off for 3 s instead of
// spinning).
func WithLongPolling(maxSuspend time.Duration, maxParked int) Option {
	return optionFunc(func(c *config) { c.maxSuspend, c.maxParked = maxSuspend, maxParked })
}

// WithPullLimits caps the messages and bytes of one pull response (default
// 32 and 256 KiB; the first message is always returned whatever its size).
func WithPullLimits(maxMsgs, maxBytes int) Option {
	return optionFunc(func(c *config) { c.pullMaxMsgs, c.pullMaxBytes = maxMsgs, maxBytes })
}

// WithRegisterInterval sets the period of the full registration with every
// name server (default 30 s).
func WithRegisterInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.registerInterval = d })
}

// WithRemotingOptions passes options to the broker's remoting.Server (frame
// size, TLS, idle timeout, handler concurrency, …). OnConnect/OnDisconnect
// are owned by the broker; do not pass them.
//
// The server's resource limits are set this way; their defaults are the
// remoting package's: remoting.WithMaxConns (10,000 connections),
// remoting.WithMaxConnsPerIP (1,000 per remote IP), remoting.WithFirstFrameTimeout
// (10 s from accept to the first complete frame), remoting.WithIdleTimeout
// (120 s without a frame), remoting.WithWriteQueueFrames (4,096) and
// remoting.WithMaxQueuedBytes (32 MiB) of responses queued, or taken by the
// socket but unacknowledged, for a client that does not read (it is cut
// there, and the requests it had already sent are not served),
// remoting.WithWriteTimeout (30 s per socket write) and
// remoting.WithMaxFrameSize (16 MiB). Parked pulls are bounded by
// WithLongPolling and message bodies by WithMaxMessageSize. Broker.ServerStats
// counts the connections each limit refused or closed.
func WithRemotingOptions(opts ...remoting.ServerOption) Option {
	return optionFunc(func(c *config) { c.remotingOpts = append(c.remotingOpts, opts...) })
}

// WithACL makes the broker check every request with p (see package acl)
// before any processor runs: requests must be signed by an account of p;
// sends need PUB on the topic, pulls, offsets, heartbeats and locks SUB on
// the topic and consumer group, administration codes an admin account; codes
// p does not know are refused. A denied request is answered NO_PERMISSION
// with a remark starting "acl: ". p may be reloaded while the broker runs
// (p.Reload). A nil p leaves ACL off (the default). Combine it with WithTLS:
// signatures authenticate requests but do not hide them.
func WithACL(p *acl.Policy) Option {
	return optionFunc(func(c *config) { c.policy = p })
}

// WithTLS sets the TLS mode of the broker port: acl.TLSDisabled (the
// default; cfg is ignored), acl.TLSPermissive (TLS and plain TCP on one
// port, for migrating clients) or acl.TLSEnforcing (TLS only), with cfg the
// server configuration (acl.ServerTLSConfig builds it from certificate, key
// and optional client-CA files). New fails when a mode other than disabled
// comes without cfg, or the mode is unknown.
func WithTLS(mode acl.TLSMode, cfg *tls.Config) Option {
	return optionFunc(func(c *config) { c.tlsMode, c.tlsConfig = mode, cfg })
}

// WithNameServerCredentials makes the broker sign every request it sends to
// name servers (REGISTER_BROKER, UNREGISTER_BROKER) with cr, as RocketMQ's
// ACL expects (acl.Sign). A name server with ACL needs an admin account for
// them. Both keys must be set. Default: requests are not signed.
func WithNameServerCredentials(cr acl.Credentials) Option {
	return optionFunc(func(c *config) { c.nsCreds = &cr })
}

// WithNameServerTLS makes the broker dial name servers over TLS with cfg
// (its RootCAs verify the name servers' certificates; its Certificates, if
// any, are presented to those that ask for client certificates). A nil cfg
// (the default) dials plain TCP.
func WithNameServerTLS(cfg *tls.Config) Option {
	return optionFunc(func(c *config) { c.nsTLS = cfg })
}

// WithDelayLevels sets the delays of message delay levels 1, 2, … (at most
// 18; default RocketMQ's 1s 5s 10s 30s 1m 2m … 2h). A DELAY above the last
// level is clamped to it. Delays are measured on the broker's clock. Tests
// use it to shorten retries (whose delay is level 3 + reconsume times).
func WithDelayLevels(levels []time.Duration) Option {
	return optionFunc(func(c *config) { c.sub.delayLevels = append([]time.Duration(nil), levels...) })
}

// WithClientExpiry sets how long a client channel may stay silent (no
// heartbeat) before it is removed and closed (default 120 s), and how
// often channels are checked (default 10 s). Both are on the broker's clock.
func WithClientExpiry(timeout, scan time.Duration) Option {
	return optionFunc(func(c *config) { c.sub.channelExpiry, c.sub.channelScan = timeout, scan })
}

// WithLockExpiry sets the lifetime of a queue lock (LOCK_BATCH_MQ) that is
// not renewed (default 60 s, on the broker's clock).
func WithLockExpiry(d time.Duration) Option {
	return optionFunc(func(c *config) { c.sub.lockExpiry = d })
}

// WithTimerMaxDelay sets the longest delay a timer message
// (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS) may ask for (default
// 72 h); longer ones get MESSAGE_ILLEGAL.
func WithTimerMaxDelay(d time.Duration) Option {
	return optionFunc(func(c *config) { c.sub.timerMaxDelay = d })
}

// WithTransactionCheckInterval sets the real-time period of the scan that
// checks back transactional half messages with their producers (default
// 30 s, at least 10 ms).
func WithTransactionCheckInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.tx.checkInterval = d })
}

// WithTransactionTimeout sets the age (on the broker's clock, from the
// half message's store time) a half message must reach before it is
// checked back (default 6 s). A message's CHECK_IMMUNITY_TIME_IN_SECONDS
// property can only lengthen it.
func WithTransactionTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.tx.timeout = d })
}

// WithTransactionCheckMax sets how many check-backs a half message gets
// before it is discarded to TRANS_CHECK_MAX_TIME_TOPIC (default 15).
func WithTransactionCheckMax(n int) Option {
	return optionFunc(func(c *config) { c.tx.checkMax = n })
}

// DefaultTransactionHalfCache is WithTransactionHalfCache's default.
const DefaultTransactionHalfCache = 128 << 20

// WithTransactionHalfCache bounds the bytes of pending half messages'
// records the broker keeps in memory, so that END_TRANSACTION finds them
// without reading the store (default 128 MiB; 0 keeps none). A half
// message stored once the bound is reached is read from the store when it
// ends. The records of a producer that ends its transactions only after
// a checkpoint (runnel's exactly-once sink, scale-out workers) stay
// pending for a checkpoint interval or more: at 18k records/s of 1 KiB
// and a 1 s interval, a 32 MiB bound left END_TRANSACTION reading the
// store for 15 % of the broker's CPU (BenchmarkScaleoutETL, one
// worker), 128 MiB for none of it.
func WithTransactionHalfCache(bytes int) Option {
	return optionFunc(func(c *config) { c.tx.halfCache = bytes })
}

// ServerStats returns the counters of the broker's remoting server:
// connections accepted and open, and those refused or closed by each of its
// limits (see WithRemotingOptions). Safe for concurrent use.
func (b *Broker) ServerStats() remoting.ServerStats { return b.srv.Stats() }
