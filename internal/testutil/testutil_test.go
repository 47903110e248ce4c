package testutil

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunClusterRoutesDefaultTopic(t *testing.T) {
	cl := RunCluster(t)
	if cl.Broker == nil || cl.BrokerAddr != cl.Broker.Addr() || cl.NameServer == "" {
		t.Fatalf("cluster fields %+v", cl)
	}
	c, err := client.New(client.WithNameServers(cl.NameServer), client.WithClientIP(netip.MustParseAddr("127.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No polling: RunCluster returns only once the broker is registered.
	r, err := c.RefreshRoute(ctx, "TBW102")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.PublishQueues()) == 0 {
		t.Fatal("TBW102 has no publish queues")
	}
	for _, q := range r.PublishQueues() {
		if q.BrokerName != BrokerName {
			t.Fatalf("queue %v on broker %q, want %q", q, q.BrokerName, BrokerName)
		}
	}
}
