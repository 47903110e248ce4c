package embedded

import (
	"fmt"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestEmbeddedHAFailover is runnel's client against a runnel master/slave
// pair (a SYNC_MASTER with one slave, and a second broker name): every
// acknowledged message is on the slave; with the master gone, pulls and
// offset commits go to the slave at the same queue offsets, and sends to
// the other broker name; once the master is back, pulls return to it.
func TestEmbeddedHAFailover(t *testing.T) {
	ctx := testCtx(t)
	cl := Run(t, WithBrokers(2), WithSlaves(1, broker.RoleSyncMaster), WithTopic("fo", 2),
		WithBrokerOptions(broker.WithHAIntervals(100*time.Millisecond, 2*time.Second, 64<<10), broker.WithSlaveSyncInterval(100*time.Millisecond)))
	a := cl.Broker(0)
	if len(a.Slaves()) != 1 || a.Slaves()[0].ID() != 1 {
		t.Fatalf("broker-a's slaves: %v", a.Slaves())
	}
	c, err := cl.NewClient(client.WithRouteRefreshInterval(100 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.RefreshRoute(ctx, "fo")
	if err != nil {
		t.Fatal(err)
	}
	if addr, ok := r.BrokerAddr(a.Name(), 1); !ok || addr != a.Slaves()[0].Server().AdvertisedAddr() {
		t.Fatalf("route of fo lists broker-a's slave at %q (%v)", addr, ok)
	}
	p, err := client.NewProducer(c, "ha_fo")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sent := map[protocol.MessageQueue]map[int64]string{} // queue → offset → body
	for i := range 40 {
		body := fmt.Sprint("m", i)
		res, err := p.Send(ctx, &client.Message{Topic: "fo", Body: []byte(body)})
		if err != nil || res.Status != client.SendOK {
			t.Fatalf("send %d: %v %v", i, res.Status, err)
		}
		if sent[res.Queue] == nil {
			sent[res.Queue] = map[int64]string{}
		}
		sent[res.Queue][res.QueueOffset] = body
	}

	if err := a.Close(); err != nil { // the master dies
		t.Fatal(err)
	}
	for q, want := range sent {
		if q.BrokerName != a.Name() {
			continue
		}
		res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: "ha_fo_g", MaxMsgs: 64})
		if err != nil {
			t.Fatalf("pull %s with its master gone: %v", q, err)
		}
		if res.Status != client.PullFound || res.BrokerID != 1 {
			t.Fatalf("pull %s with its master gone: %v from broker %d", q, res.Status, res.BrokerID)
		}
		for _, m := range res.Messages {
			if want[m.QueueOffset] != string(m.Body) {
				t.Fatalf("%s offset %d on the slave holds %q, acknowledged for %q", q, m.QueueOffset, m.Body, want[m.QueueOffset])
			}
		}
		if len(res.Messages) != len(want) {
			t.Fatalf("%s: the slave has %d of the %d acknowledged messages", q, len(res.Messages), len(want))
		}
		if err := c.CommitOffset(ctx, "ha_fo_g", q, int64(len(want))); err != nil {
			t.Fatalf("commit offset of %s with its master gone: %v", q, err)
		}
		if off, err := c.QueryConsumerOffset(ctx, "ha_fo_g", q); err != nil || off != int64(len(want)) {
			t.Fatalf("consumer offset of %s from the slave: %d %v", q, off, err)
		}
	}
	// Sends go to the broker that has a master.
	for i := range 10 {
		res, err := p.Send(ctx, &client.Message{Topic: "fo", Body: []byte(fmt.Sprint("later", i))})
		if err != nil {
			t.Fatalf("send %d with broker-a's master gone: %v", i, err)
		}
		if res.Queue.BrokerName == a.Name() {
			t.Fatalf("send %d went to %s, whose master is gone", i, res.Queue)
		}
	}

	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var q protocol.MessageQueue
	for q = range sent {
		if q.BrokerName == a.Name() {
			break
		}
	}
	poll.Until(t, 20*time.Second, 20*time.Millisecond, func() error {
		res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Group: "ha_fo_g", MaxMsgs: 1})
		if err != nil {
			return err
		}
		if res.BrokerID != 0 {
			return fmt.Errorf("pull of %s served by broker %d", q, res.BrokerID)
		}
		return nil
	})
}

// TestEmbeddedHALocks: queue locks (LOCK_BATCH_MQ) on a pair behave as on
// a single broker: the master holds them; with the master gone no member
// gets a lock (the client asks only masters; a slave grants none), and a
// restarted master, whose locks are in memory as Java's are, grants them
// anew to the first member asking.
func TestEmbeddedHALocks(t *testing.T) {
	ctx := testCtx(t)
	cl := Run(t, WithSlaves(1, broker.RoleSyncMaster), WithTopic("lk", 2),
		WithBrokerOptions(broker.WithHAIntervals(100*time.Millisecond, 2*time.Second, 64<<10), broker.WithSlaveSyncInterval(100*time.Millisecond)))
	a := cl.Broker(0)
	member := func(name string) *client.GroupConsumer {
		c, err := cl.NewClient(client.WithInstanceName(name), client.WithRouteRefreshInterval(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		g, err := client.NewGroupConsumer(c, "lk_g")
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g1, g2 := member("lk1"), member("lk2")
	qs := []protocol.MessageQueue{{Topic: "lk", BrokerName: a.Name(), QueueID: 0}, {Topic: "lk", BrokerName: a.Name(), QueueID: 1}}
	if got := g1.LockQueues(ctx, qs...); len(got) != 2 {
		t.Fatalf("first member granted %v, want both queues", got)
	}
	if got := g2.LockQueues(ctx, qs...); len(got) != 0 {
		t.Fatalf("second member granted %v while the first holds them", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*client.GroupConsumer{g2, g1} {
		if got := g.LockQueues(ctx, qs...); len(got) != 0 {
			t.Fatalf("granted %v with the master gone", got)
		}
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, 50*time.Millisecond, func() error {
		if got := g1.LockQueues(ctx, qs...); len(got) != 2 {
			return fmt.Errorf("the restarted master granted %v", got)
		}
		return nil
	})
	if got := g2.LockQueues(ctx, qs...); len(got) != 0 {
		t.Fatalf("second member granted %v after the first locked them on the restarted master", got)
	}
}
