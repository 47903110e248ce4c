// Package testutil holds helpers shared by runnel's tests: an embedded name
// server plus broker on loopback (RunCluster and StartNameServer, thin
// wrappers over package embedded for the tests written before it) and a
// deadline-bounded poller (CheckFor). It is imported only from _test.go
// files.
package testutil

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// BrokerName is the broker name RunCluster gives its broker unless an
// option overrides it (embedded.BrokerName(0)).
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
	// Embedded is the cluster itself (fault hooks, CreateTopic, Messages).
	Embedded *embedded.Cluster
}

// RunCluster starts a name server and a broker (named BrokerName, async
// flush, listening on 127.0.0.1:0, data in t.TempDir(); opts are applied
// after these defaults and may override them), waits until the name server
// lists the broker — so its topics, TBW102 included, are routable — and
// registers t.Cleanup to close both. It blocks for at most about 20 s and
// fails t on any error. It is embedded.Start with
// embedded.WithBrokerOptions(opts...).
func RunCluster(t testing.TB, opts ...broker.Option) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	ec, err := embedded.Start(ctx, embedded.WithDataDir(t.TempDir()), embedded.WithBrokerOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	b := ec.Broker(0)
	return &Cluster{NameServer: ec.NameServer(), BrokerAddr: b.Addr(), Broker: b.Server(), Embedded: ec}
}

// StartNameServer starts a name server on 127.0.0.1:0 with its KV config in
// t.TempDir() and registers t.Cleanup to close it; it fails t on any error.
// It is embedded.Start with embedded.WithBrokers(0).
func StartNameServer(ctx context.Context, t testing.TB) *namesrv.Server {
	t.Helper()
	ec, err := embedded.Start(ctx, embedded.WithDataDir(t.TempDir()), embedded.WithBrokers(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	return ec.Namesrv()
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
