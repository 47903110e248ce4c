package javapeer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// bootTimeout bounds one JVM's start until "boot success"; generous because
// test packages run in parallel on two cores and a cold JVM is slow.
const bootTimeout = 90 * time.Second

// Default names of a cluster's broker.
const (
	ClusterName = "DefaultCluster"
	BrokerName  = "broker-java"
)

// Option configures StartCluster.
type Option interface{ apply(*clusterConfig) }

type clusterConfig struct {
	brokerName  string
	brokerProps map[string]string
	nsProps     map[string]string
	brokerHeap  string
	nsHeap      string
	files       map[string]string // ROCKETMQ_HOME-relative path -> contents (a per-cluster home)
	brokerSys   map[string]string // broker JVM system properties (-Dk=v)
}

type optionFunc func(*clusterConfig)

func (f optionFunc) apply(c *clusterConfig) { f(c) }

// WithBrokerProperty sets one broker.conf property (RocketMQ's own names:
// flushDiskType=SYNC_FLUSH, aclEnable=true, enablePropertyFilter=true, …),
// after the harness's defaults.
func WithBrokerProperty(key, value string) Option {
	return optionFunc(func(c *clusterConfig) { c.brokerProps[key] = value })
}

// WithNameServerProperty sets one name server property.
func WithNameServerProperty(key, value string) Option {
	return optionFunc(func(c *clusterConfig) { c.nsProps[key] = value })
}

// WithBrokerSystemProperty sets a JVM system property of the broker
// (-Dkey=value), for settings RocketMQ reads only from system properties,
// such as rocketmq.broker.rebalance.lockMaxLiveTime (the queue lock
// lifetime, 60000 ms by default).
func WithBrokerSystemProperty(key, value string) Option {
	return optionFunc(func(c *clusterConfig) { c.brokerSys[key] = value })
}

// WithBrokerName names the broker (default BrokerName).
func WithBrokerName(name string) Option {
	return optionFunc(func(c *clusterConfig) { c.brokerName = name })
}

// WithBrokerHeap sets the broker's -Xmx and -Xms (default "320m").
func WithBrokerHeap(size string) Option {
	return optionFunc(func(c *clusterConfig) { c.brokerHeap = size })
}

// WithHomeFile writes a file under the cluster's own ROCKETMQ_HOME (for
// example "conf/plain_acl.yml"); with any such file the cluster gets a home
// of its own, a copy of the Dist's conf/ plus these files.
func WithHomeFile(rel, contents string) Option {
	return optionFunc(func(c *clusterConfig) { c.files[rel] = contents })
}

// Cluster is a running Java name server and broker. Its exported fields are
// set by StartCluster and only read afterwards; its methods are safe for
// concurrent use.
type Cluster struct {
	// NameServer is the name server's "127.0.0.1:port".
	NameServer string
	// Broker is the broker's "127.0.0.1:port".
	Broker string
	// BrokerName and ClusterName are the broker's names.
	BrokerName, ClusterName string
	// Dir holds the configs, logs and store.
	Dir string

	dist       *Dist
	home       string
	brokerHeap string
	brokerSys  []string // -Dk=v flags of the broker JVM

	mu struct {
		sync.Mutex
		ns, broker *proc
		closed     bool
	}
	brokerConf string
}

// StartCluster starts a name server and a broker of d under dir (which
// must exist and be empty or hold a previous run's store to reuse) and
// waits for both to boot. It blocks for at most ctx and about twice
// bootTimeout. The caller must Close the cluster.
func (d *Dist) StartCluster(ctx context.Context, dir string, opts ...Option) (*Cluster, error) {
	cfg := clusterConfig{brokerName: BrokerName, brokerProps: map[string]string{}, nsProps: map[string]string{},
		brokerHeap: "320m", nsHeap: "128m", files: map[string]string{}, brokerSys: map[string]string{}}
	for _, o := range opts {
		o.apply(&cfg)
	}
	c := &Cluster{BrokerName: cfg.brokerName, ClusterName: ClusterName, Dir: dir, dist: d, home: d.Home, brokerHeap: cfg.brokerHeap}
	for _, k := range slices.Sorted(maps.Keys(cfg.brokerSys)) {
		c.brokerSys = append(c.brokerSys, "-D"+k+"="+cfg.brokerSys[k])
	}
	if len(cfg.files) > 0 {
		c.home = filepath.Join(dir, "home")
		if err := copyDir(filepath.Join(d.Home, "conf"), filepath.Join(c.home, "conf")); err != nil {
			return nil, err
		}
		for rel, body := range cfg.files {
			p := filepath.Join(c.home, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, fmt.Errorf("javapeer: %w", err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				return nil, fmt.Errorf("javapeer: %w", err)
			}
		}
	}
	nsPort, brokerPort, err := freePorts()
	if err != nil {
		return nil, err
	}
	c.NameServer = "127.0.0.1:" + strconv.Itoa(nsPort)
	c.Broker = "127.0.0.1:" + strconv.Itoa(brokerPort)

	ns := map[string]string{"listenPort": strconv.Itoa(nsPort), "bindAddress": "127.0.0.1"}
	maps.Copy(ns, cfg.nsProps)
	nsConf := filepath.Join(dir, "namesrv.conf")
	if err := writeProps(nsConf, ns); err != nil {
		return nil, err
	}
	store := filepath.Join(dir, "store")
	bp := map[string]string{
		"brokerClusterName":           ClusterName,
		"brokerName":                  cfg.brokerName,
		"brokerId":                    "0",
		"brokerIP1":                   "127.0.0.1",
		"brokerIP2":                   "127.0.0.1",
		"listenPort":                  strconv.Itoa(brokerPort),
		"bindAddress":                 "127.0.0.1",
		"namesrvAddr":                 c.NameServer,
		"storePathRootDir":            store,
		"storePathCommitLog":          filepath.Join(store, "commitlog"),
		"autoCreateTopicEnable":       "true",
		"autoCreateSubscriptionGroup": "true",
		"flushDiskType":               "ASYNC_FLUSH",
		// Small files: the defaults (1 GiB commit log files, 6 MB consume
		// queue files) would be allocated per test cluster.
		"mappedFileSizeCommitLog":    strconv.Itoa(64 << 20),
		"mappedFileSizeConsumeQueue": strconv.Itoa(300000 * 20 / 10),
		"mappedFileSizeTimerLog":     strconv.Itoa(16 << 20),
		"enablePropertyFilter":       "true",
		// Check-back soon, so transaction tests do not wait a minute.
		"transactionCheckInterval": "5000",
		"transactionTimeOut":       "3000",
		"diskMaxUsedSpaceRatio":    "95",
	}
	maps.Copy(bp, cfg.brokerProps)
	c.brokerConf = filepath.Join(dir, "broker.conf")
	if err := writeProps(c.brokerConf, bp); err != nil {
		return nil, err
	}

	nsProc, err := c.startJVM(ctx, "namesrv", cfg.nsHeap, nil, "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", nsConf)
	if err != nil {
		return nil, err
	}
	c.mu.ns = nsProc
	bk, err := c.startJVM(ctx, "broker", c.brokerHeap, c.brokerSys, "org.apache.rocketmq.broker.BrokerStartup", "-c", c.brokerConf)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	c.mu.broker = bk
	if err := c.awaitRegistration(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// registrationTimeout bounds the wait for the name server to list a
// booted broker.
const registrationTimeout = 60 * time.Second

// awaitRegistration waits until the name server lists the broker: a 5.x
// broker prints "boot success" before its first registration has been
// answered, so a client could otherwise find no route right after start.
// A name server that refuses the query (ACL) is not waited for.
func (c *Cluster) awaitRegistration(ctx context.Context) error {
	cl, err := client.New(client.WithNameServers(c.NameServer), client.WithClientIP(netip.MustParseAddr("127.0.0.1")))
	if err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	defer func() { _ = cl.Close() }()
	ctx, cancel := context.WithTimeout(ctx, registrationTimeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		ci, err := cl.ClusterInfo(ctx)
		var perr *protocol.Error
		switch {
		case err == nil:
			if bd, ok := ci.BrokerAddrTable[c.BrokerName]; ok && bd.BrokerAddrs[0] == c.Broker {
				return nil
			}
			last = fmt.Errorf("the name server does not list %s at %s yet", c.BrokerName, c.Broker)
		case errors.As(err, &perr):
			return nil // it answers, but not this query: nothing to wait on
		default:
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("javapeer: broker %s not registered with %s: %w (last: %v)\n%s", c.Broker, c.NameServer, ctx.Err(), last, c.Logs())
		case <-t.C:
		}
	}
}

// startJVM starts one of the cluster's JVMs and waits for "boot success".
// Its direct memory may grow to 1 GiB: every thread of a 5.x broker that
// stores a message keeps a direct buffer of the largest message plus
// 64 KiB (CommitLog's PutMessageThreadLocal, 4 MiB by default), and one
// broker serving a whole package's tests meets some sixty such threads
// (send, end-transaction, pop, timer, schedule...); with 256 MiB the
// package's second -count run failed with "Cannot reserve 4259840 bytes
// of direct buffer memory".
func (c *Cluster) startJVM(ctx context.Context, name, heap string, sysProps []string, mainClass string, args ...string) (*proc, error) {
	jvm := []string{"-Xms" + heap, "-Xmx" + heap, "-XX:MaxDirectMemorySize=1g", "-XX:+UseSerialGC",
		"-Duser.home=" + c.Dir, "-Drocketmq.home.dir=" + c.home, "-Djava.net.preferIPv4Stack=true"}
	jvm = append(append(jvm, sysProps...), "-cp", c.dist.Classpath(), mainClass)
	cmd := exec.Command(c.dist.Java, append(jvm, args...)...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), "ROCKETMQ_HOME="+c.home)
	p := newProc(name, cmd, filepath.Join(c.Dir, name+".out"))
	seen := p.lineSeen("boot success")
	if err := p.start(nil); err != nil {
		return nil, err
	}
	if err := p.awaitLine(ctx, seen, bootTimeout, "boot success"); err != nil {
		_ = p.kill(syscall.SIGKILL, 5*time.Second)
		return nil, fmt.Errorf("%w\n%s", err, c.rocketmqLog(name))
	}
	return p, nil
}

// rocketmqLog is the tail of RocketMQ's own log of one process.
func (c *Cluster) rocketmqLog(name string) string {
	dir := filepath.Join(c.Dir, "logs", "rocketmqlogs")
	b, err := os.ReadFile(filepath.Join(dir, name+".log"))
	if err != nil {
		return "(no " + name + ".log in " + dir + ")"
	}
	return name + ".log:\n" + Tail(b, 40)
}

// KillBroker SIGKILLs the broker (by PID) and waits for it to exit.
func (c *Cluster) KillBroker() error {
	c.mu.Lock()
	b := c.mu.broker
	c.mu.broker = nil
	c.mu.Unlock()
	if b == nil {
		return errors.New("javapeer: broker is not running")
	}
	return b.kill(syscall.SIGKILL, 10*time.Second)
}

// StartBroker starts the broker again on its port and store, after
// KillBroker.
func (c *Cluster) StartBroker(ctx context.Context) error {
	c.mu.Lock()
	if c.mu.closed || c.mu.broker != nil {
		c.mu.Unlock()
		return errors.New("javapeer: broker running or cluster closed")
	}
	c.mu.Unlock()
	b, err := c.startJVM(ctx, "broker", c.brokerHeap, c.brokerSys, "org.apache.rocketmq.broker.BrokerStartup", "-c", c.brokerConf)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		_ = b.kill(syscall.SIGKILL, 10*time.Second)
		return errors.New("javapeer: cluster closed")
	}
	c.mu.broker = b
	return nil
}

// BrokerPID is the broker JVM's process id, or 0 when it is not running.
func (c *Cluster) BrokerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.broker == nil {
		return 0
	}
	return c.mu.broker.pid()
}

// Close kills both JVMs (SIGKILL: the store is thrown away with Dir) and
// waits for them. It is idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	procs := []*proc{c.mu.broker, c.mu.ns}
	c.mu.broker, c.mu.ns, c.mu.closed = nil, nil, true
	c.mu.Unlock()
	for _, p := range procs {
		if p != nil {
			_ = p.kill(syscall.SIGKILL, 10*time.Second)
		}
	}
	return nil
}

// Logs returns the tail of the broker's and name server's logs, for a
// failing test to print.
func (c *Cluster) Logs() string {
	return c.rocketmqLog("broker") + "\n" + c.rocketmqLog("namesrv")
}

// freePorts picks a name server port and a broker port whose fast port
// (broker-2) and HA port (broker+1) are free too.
func freePorts() (ns, broker int, err error) {
	ns, err = freePort()
	if err != nil {
		return 0, 0, err
	}
	for range 50 {
		p, err := freePort()
		if err != nil {
			return 0, 0, err
		}
		if p < 1026 || p > 65533 || p-2 == ns || p+1 == ns {
			continue
		}
		if portFree(p-2) && portFree(p+1) {
			return ns, p, nil
		}
	}
	return 0, 0, errors.New("javapeer: no free broker port with free neighbours")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("javapeer: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portFree(p int) bool {
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// writeProps writes a Java properties file, keys sorted.
func writeProps(path string, props map[string]string) error {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	return nil
}

// copyDir copies the regular files of src into dst (one level).
func copyDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return fmt.Errorf("javapeer: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return fmt.Errorf("javapeer: %w", err)
		}
	}
	return nil
}
