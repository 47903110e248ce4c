package javatest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// brokerVersions are the Apache RocketMQ versions runnel's client is
// tested against (TestJavaBroker…), each on its shared cluster.
var brokerVersions = []string{javapeer.Version5, javapeer.Version4}

// eachBroker runs fn as a subtest per pinned version, on that version's
// shared cluster.
func eachBroker(t *testing.T, fn func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster)) {
	t.Helper()
	for _, v := range brokerVersions {
		t.Run(v, func(t *testing.T) {
			d, c := javaCluster(t, v)
			awaitRegistered(t, c)
			fn(t, d, c)
		})
	}
}

// eachBrokerParallel is eachBroker with the versions' subtests in
// parallel, for tests that mostly wait for the broker (check-backs, long
// polls, timers, locks).
func eachBrokerParallel(t *testing.T, fn func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster)) {
	t.Helper()
	for _, v := range brokerVersions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			d, c := javaCluster(t, v)
			awaitRegistered(t, c)
			fn(t, d, c)
		})
	}
}

// registered holds the clusters whose broker the name server was seen to
// list (*javapeer.Cluster → struct{}).
var registered sync.Map

// awaitRegistered waits until c's name server lists c's broker: right
// after "boot success" a 5.x broker may not have registered yet (it does so
// asynchronously), and until it has, routes and cluster info lack it.
func awaitRegistered(t testing.TB, c *javapeer.Cluster) {
	t.Helper()
	if _, ok := registered.Load(c); ok {
		return
	}
	cl := newJavaClient(t, c)
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ci, err := cl.ClusterInfo(ctx)
		if err != nil {
			return err
		}
		if bd, ok := ci.BrokerAddrTable[c.BrokerName]; !ok || bd.BrokerAddrs[protocol.MasterID] != c.Broker {
			return fmt.Errorf("name server %s does not list broker %s at %s yet", c.NameServer, c.BrokerName, c.Broker)
		}
		return nil
	})
	registered.Store(c, struct{}{})
}

// newJavaClient returns a runnel client of c's name server (client IP
// 127.0.0.1, then opts), closed at the end of the test.
func newJavaClient(t testing.TB, c *javapeer.Cluster, opts ...client.Option) *client.Client {
	t.Helper()
	cl, err := client.New(append([]client.Option{client.WithNameServers(c.NameServer),
		client.WithClientIP(netip.MustParseAddr("127.0.0.1")), client.WithRequestTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func newJavaProducer(t testing.TB, cl *client.Client, group string, opts ...client.ProducerOption) *client.Producer {
	t.Helper()
	p, err := client.NewProducer(cl, group, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// createJavaTopic creates topic with n queues on every master of c's cluster
// through runnel's admin call, waits until the name server routes it with
// n read and write queues, and returns the publish queues.
func createJavaTopic(t testing.TB, cl *client.Client, c *javapeer.Cluster, topic string, n int) []protocol.MessageQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Right after "boot success" the Java broker may not have registered
	// with its name server yet (5.x registers asynchronously): the cluster
	// is unknown (ErrNoRoute) until it has.
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		err := cl.CreateTopic(ctx, c.ClusterName, client.TopicConfig{TopicName: topic, ReadQueueNums: int32(n), WriteQueueNums: int32(n)})
		if err != nil && !errors.Is(err, client.ErrNoRoute) {
			t.Fatal(err)
		}
		return err
	})
	var qs []protocol.MessageQueue
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		r, err := cl.RefreshRoute(ctx, topic)
		if err != nil {
			return err
		}
		qs = r.PublishQueues()
		if len(qs) != n || len(r.SubscribeQueues()) != n {
			return fmt.Errorf("route of %s: %d publish and %d subscribe queues, want %d", topic, len(qs), len(r.SubscribeQueues()), n)
		}
		return nil
	})
	return qs
}

// pullAll reads q from offset from until it has want messages or
// nothing more arrives within wait (with wait 0: until the end of the
// queue), and returns clones of them.
func pullAll(t testing.TB, cl *client.Client, q protocol.MessageQueue, group string, from int64, want int, wait time.Duration) []protocol.MessageExt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	var out []protocol.MessageExt
	off := from
	deadline := time.Now().Add(wait)
	for len(out) < want {
		suspend := min(max(time.Until(deadline), 0), 5*time.Second)
		res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: off, Group: group, Suspend: suspend})
		if err != nil {
			t.Fatalf("pull %s at %d: %v", q, off, err)
		}
		for i := range res.Messages {
			out = append(out, res.Messages[i].Clone())
		}
		switch res.Status {
		case client.PullFound, client.PullNoMatchedMsg:
			off = res.NextBeginOffset
		case client.PullOffsetIllegal:
			t.Fatalf("pull %s at %d: offset illegal (next %d, min %d, max %d)", q, off, res.NextBeginOffset, res.MinOffset, res.MaxOffset)
		case client.PullNoNewMsg:
			if !time.Now().Before(deadline) {
				return out
			}
		}
	}
	return out
}

// pullTopic reads every queue of qs from offset 0 until want messages
// arrived in all (or wait elapsed) and returns them by UNIQ_KEY.
func pullQueuesTopic(t testing.TB, cl *client.Client, qs []protocol.MessageQueue, group string, want int, wait time.Duration) map[string]protocol.MessageExt {
	t.Helper()
	out := map[string]protocol.MessageExt{}
	next := make([]int64, len(qs))
	deadline := time.Now().Add(wait)
	ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	for len(out) < want && time.Now().Before(deadline) {
		progress := false
		for i, q := range qs {
			res, err := cl.Pull(ctx, client.PullRequest{Queue: q, Offset: next[i], Group: group})
			if err != nil {
				t.Fatalf("pull %s at %d: %v", q, next[i], err)
			}
			for j := range res.Messages {
				m := res.Messages[j].Clone()
				out[m.UniqKey()] = m
				progress = true
			}
			if res.Status == client.PullFound || res.Status == client.PullNoMatchedMsg {
				next[i] = res.NextBeginOffset
			}
		}
		if !progress && len(out) < want {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return out
}

func bg(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
