// Package testutil holds helpers shared by runnel's tests: an embedded name
// server plus broker on loopback (RunCluster) and a deadline-bounded poller
// (CheckFor). It is imported only from _test.go files.
package testutil

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// BrokerName is the broker name RunCluster gives its broker unless an
// option overrides it.
const BrokerName = "broker-a"

// startTimeout bounds starting the cluster and waiting for its registration.
const startTimeout = 20 * time.Second

// Cluster is a real name server and broker listening on 127.0.0.1 with
// their data in t.TempDir(). Its fields are set once by RunCluster and
// only read afterwards, so a Cluster is safe for concurrent use.
type Cluster struct {
	// NameServer is the name server's "ip:port".
	NameServer string
	// BrokerAddr is the broker's listen "ip:port".
	BrokerAddr string
	// Broker is the running broker; t.Cleanup closes it.
	Broker *broker.Broker
}

// RunCluster starts a name server and a broker (named BrokerName, async
// flush, listening on 127.0.0.1:0, data in t.TempDir(); opts are applied
// after these defaults and may override them), waits until the name server
// lists the broker — so its topics, TBW102 included, are routable — and
// registers t.Cleanup to close both. It blocks for at most about 20 s and
// fails t on any error.
func RunCluster(t testing.TB, opts ...broker.Option) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	ns := StartNameServer(ctx, t)
	bopts := append([]broker.Option{broker.WithDataDir(t.TempDir()), broker.WithListenAddr("127.0.0.1:0"),
		broker.WithBrokerName(BrokerName), broker.WithNameServers(ns.Addr()), broker.WithFlushMode(broker.FlushAsync)}, opts...)
	b, err := broker.New(bopts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	cl := &Cluster{NameServer: ns.Addr(), BrokerAddr: b.Addr(), Broker: b}
	cl.waitRegistered(t, ctx)
	return cl
}

// StartNameServer starts a name server on 127.0.0.1:0 with its KV config in
// t.TempDir() and registers t.Cleanup to close it; it fails t on any error.
func StartNameServer(ctx context.Context, t testing.TB) *namesrv.Server {
	t.Helper()
	ns, err := namesrv.New(namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithKVConfigDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	return ns
}

// waitRegistered polls the name server until it lists the broker's
// advertised address as a master. A broker registers its whole topic table
// at once, so from then on every topic it had at start (TBW102 too, unless
// auto-creation is off) is routable.
func (cl *Cluster) waitRegistered(t testing.TB, ctx context.Context) {
	t.Helper()
	c, err := client.New(client.WithNameServers(cl.NameServer), client.WithClientIP(netip.MustParseAddr("127.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	want := cl.Broker.AdvertisedAddr()
	CheckFor(t, startTimeout, 10*time.Millisecond, func() error {
		ci, err := c.ClusterInfo(ctx)
		if err != nil {
			return err
		}
		for _, bd := range ci.BrokerAddrTable {
			if bd.BrokerAddrs[0] == want {
				return nil
			}
		}
		return fmt.Errorf("testutil: name server %s does not list broker %s yet", cl.NameServer, want)
	})
}

// CheckFor calls fn every `every` until it returns nil, and fails t with
// fn's last error if that has not happened within total. fn runs at least
// once. It blocks the calling goroutine; it must be called from the test's
// goroutine because it may call t.Fatalf. It is poll.Until, which the tests
// of packages this one imports use directly.
func CheckFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	poll.Until(t, total, every, fn)
}

// NewClient returns a client of cl's name server (client IP 127.0.0.1,
// then opts), closed at the end of the test.
func (cl *Cluster) NewClient(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(append([]client.Option{client.WithNameServers(cl.NameServer),
		client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NewProducer returns a producer of c in group, closed at the end of the
// test.
func NewProducer(t testing.TB, c *client.Client, group string) *client.Producer {
	t.Helper()
	p, err := client.NewProducer(c, group)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// CreateTopic creates topic with n read and write queues on the broker at
// brokerAddr through c, waits (at most 20 s) until c's route of it shows n
// publish and n subscribe queues, and returns the publish queues.
func CreateTopic(t testing.TB, c *client.Client, brokerAddr, topic string, n int) []protocol.MessageQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.CreateTopic(ctx, brokerAddr, client.TopicConfig{TopicName: topic, ReadQueueNums: int32(n), WriteQueueNums: int32(n)}); err != nil {
		t.Fatal(err)
	}
	var qs []protocol.MessageQueue
	CheckFor(t, startTimeout, 10*time.Millisecond, func() error {
		r, err := c.RefreshRoute(ctx, topic)
		if err != nil {
			return fmt.Errorf("route of %s: %w", topic, err)
		}
		qs = r.PublishQueues()
		if len(qs) != n || len(r.SubscribeQueues()) != n {
			return fmt.Errorf("route of %s has %d publish and %d subscribe queues, want %d", topic, len(qs), len(r.SubscribeQueues()), n)
		}
		return nil
	})
	return qs
}
