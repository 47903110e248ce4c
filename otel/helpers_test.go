package otel_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is a real name server and broker on loopback.
type cluster struct {
	t  testing.TB
	ns string
	b  *broker.Broker
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	tc := testutil.RunCluster(t)
	return &cluster{t: t, ns: tc.NameServer, b: tc.Broker}
}

// client returns a client (closed at cleanup) with hooks.
func (cl *cluster) client(hooks ...client.Hook) *client.Client {
	cl.t.Helper()
	c, err := client.New(client.WithNameServers(cl.ns), client.WithClientIP(netip.MustParseAddr("127.0.0.1")), client.WithHooks(hooks...))
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (cl *cluster) producer(c *client.Client, group string) *client.Producer {
	cl.t.Helper()
	p, err := client.NewProducer(c, group)
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = p.Close() })
	return p
}

// createTopic creates topic with n queues and waits for its route.
func (cl *cluster) createTopic(c *client.Client, topic string, n int) {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.CreateTopic(ctx, cl.b.Addr(), client.TopicConfig{TopicName: topic, ReadQueueNums: int32(n), WriteQueueNums: int32(n)}); err != nil {
		cl.t.Fatal(err)
	}
	testutil.CheckFor(cl.t, 20*time.Second, 10*time.Millisecond, func() error {
		r, err := c.RefreshRoute(ctx, topic)
		if err != nil {
			return err
		}
		if got := len(r.SubscribeQueues()); got != n {
			return fmt.Errorf("route of %s has %d queues, want %d", topic, got, n)
		}
		return nil
	})
}

func queue(topic string, id int) protocol.MessageQueue {
	return protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: int32(id)}
}
