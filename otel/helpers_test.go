package otel_test

import (
	"testing"

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
	tc *testutil.Cluster
	b  *broker.Broker
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	tc := testutil.RunCluster(t)
	return &cluster{t: t, tc: tc, b: tc.Broker}
}

// client returns a client (closed at cleanup) with hooks.
func (cl *cluster) client(hooks ...client.Hook) *client.Client {
	cl.t.Helper()
	return cl.tc.NewClient(cl.t, client.WithHooks(hooks...))
}

func (cl *cluster) producer(c *client.Client, group string) *client.Producer {
	cl.t.Helper()
	return testutil.NewProducer(cl.t, c, group)
}

// createTopic creates topic with n queues and waits for its route.
func (cl *cluster) createTopic(c *client.Client, topic string, n int) {
	cl.t.Helper()
	testutil.CreateTopic(cl.t, c, cl.b.Addr(), topic, n)
}

func queue(topic string, id int) protocol.MessageQueue {
	return protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: int32(id)}
}
