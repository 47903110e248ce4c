package javatest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// noTimer is a rebalance interval longer than any test: rebalances then
// come only from Start, NOTIFY_CONSUMER_IDS_CHANGED and lock retries.
const noTimer = 10 * time.Minute

func startGroup(t *testing.T, cl *client.Client, group, topic string, opts ...client.GroupOption) *client.GroupConsumer {
	t.Helper()
	g, err := client.NewGroupConsumer(cl, group, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe(topic, "*"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return g
}

// waitAssigned waits until g owns exactly n queues and returns them.
func waitAssigned(t *testing.T, what string, g *client.GroupConsumer, n int) []protocol.MessageQueue {
	t.Helper()
	var got []protocol.MessageQueue
	start := time.Now()
	testutil.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if got = g.Assignment(); len(got) != n {
			return fmt.Errorf("%s owns %d queues (%v), want %d", what, len(got), got, n)
		}
		return nil
	})
	t.Logf("%s: %d queues after %v", what, n, time.Since(start).Round(time.Millisecond))
	return got
}

// TestJavaBrokerGroupRebalance: two runnel members of one group on the
// Java broker split a topic's queues; the first gives half up as soon as the
// broker tells it the membership changed (NOTIFY_CONSUMER_IDS_CHANGED, with
// no rebalance timer to do it), and takes them back when the second leaves
// (UNREGISTER_CLIENT) and when a third's connection just closes.
func TestJavaBrokerGroupRebalance(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		admin := newJavaClient(t, c)
		topic := uniqueName(t, "rb")
		createJavaTopic(t, admin, c, topic, 4)
		group := uniqueName(t, "g")
		ca := newJavaClient(t, c, client.WithInstanceName("a"))
		cb := newJavaClient(t, c, client.WithInstanceName("b"))
		ga := startGroup(t, ca, group, topic, client.WithRebalanceInterval(noTimer))
		waitAssigned(t, "a alone", ga, 4)
		gb := startGroup(t, cb, group, topic, client.WithRebalanceInterval(noTimer))
		qb := waitAssigned(t, "b", gb, 2)
		qa := waitAssigned(t, "a after b joined", ga, 2)
		for _, q := range qa {
			if slices.Contains(qb, q) {
				t.Fatalf("a %v and b %v share %s", qa, qb, q)
			}
		}
		// AllocateAveragely over the sorted ids 127.0.0.1@a < 127.0.0.1@b.
		if qa[0].QueueID != 0 || qa[1].QueueID != 1 {
			t.Fatalf("a owns %v, want queues 0 and 1", qa)
		}
		if err := gb.Close(); err != nil {
			t.Fatal(err)
		}
		waitAssigned(t, "a after b left", ga, 4)

		// A member whose connection closes without unregistering.
		cc := newJavaClient(t, c, client.WithInstanceName("c"))
		gc := startGroup(t, cc, group, topic, client.WithRebalanceInterval(noTimer))
		waitAssigned(t, "c", gc, 2)
		waitAssigned(t, "a after c joined", ga, 2)
		_ = cc.Close()
		waitAssigned(t, "a after c's connection closed", ga, 4)
	})
}

// TestJavaBrokerGroupWithJavaConsumer: a runnel member and a Java push
// consumer share one group on the Java broker. Offsets runnel commits are
// where the Java consumer starts; the queues split between them as
// AllocateMessageQueueAveragely says (each side learns of the other through
// NOTIFY_CONSUMER_IDS_CHANGED); the Java consumer consumes only its own
// queues, and the offsets it commits on shutdown are what runnel's
// QueryConsumerOffset and ConsumerOffsets read.
func TestJavaBrokerGroupWithJavaConsumer(t *testing.T) {
	eachBroker(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		cl := newJavaClient(t, c, client.WithInstanceName("runnel"))
		topic := uniqueName(t, "mixed")
		qs := createJavaTopic(t, cl, c, topic, 4)
		group := uniqueName(t, "g")
		p := newJavaProducer(t, cl, uniqueName(t, "pg"))
		for i := range qs {
			for j := range 2 {
				if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: fmt.Appendf(nil, "q%d-%d", i, j), Queue: &qs[i]}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A 5.x broker knows a group only once a heartbeat, a pull or an
		// admin created it (UPDATE_CONSUMER_OFFSET of an unknown group is
		// SUBSCRIPTION_GROUP_NOT_EXIST): join first.
		g := startGroup(t, cl, group, topic, client.WithRebalanceInterval(noTimer))
		waitAssigned(t, "runnel alone", g, 4)
		// Offsets committed by runnel: skip the first message of each queue.
		for _, q := range qs {
			off, err := cl.QueryConsumerOffset(ctx, group, q)
			if d.Version == javapeer.Version4 {
				// 4.9 ignores setZeroIfNotFound=false: a queue whose first
				// message is still in memory answers 0.
				if err != nil || off != 0 {
					t.Fatalf("4.9: offset of a new group: %d, %v, want 0", off, err)
				}
			} else if !errors.Is(err, client.ErrNoOffset) {
				t.Fatalf("offset of a new group: %d, %v, want ErrNoOffset", off, err)
			}
			if err := cl.CommitOffset(ctx, group, q, 1); err != nil {
				t.Fatal(err)
			}
			if off, err := cl.QueryConsumerOffset(ctx, group, q); err != nil || off != 1 {
				t.Fatalf("committed offset of %s: %d, %v", q, off, err)
			}
		}

		dr := d.NewDriver(t)
		pr, err := dr.Start(ctx, c.NameServer, "push", "--topic", topic, "--group", group, "--count", "2", "--timeout-ms", "60000")
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Kill()
		if _, err := pr.Next(ctx, "started"); err != nil {
			t.Fatal(err)
		}
		ours := waitAssigned(t, "runnel with a Java member", g, 2)
		var recv []javapeer.Event
		for ev := range pr.Events() {
			switch ev.Kind() {
			case "recv":
				recv = append(recv, ev)
			case "timeout", "error":
				t.Fatalf("Java push consumer: %v", ev)
			}
		}
		if err := pr.Wait(); err != nil {
			t.Fatal(err)
		}
		theirs := map[int32]bool{}
		for _, ev := range recv {
			q := int32(ev.Int("q"))
			if slices.ContainsFunc(ours, func(mq protocol.MessageQueue) bool { return mq.QueueID == q }) {
				t.Fatalf("Java consumed %v from a queue runnel owns (%v)", ev, ours)
			}
			if ev.Int("qoff") != 1 || ev.Str("body") != fmt.Sprintf("q%d-1", q) {
				t.Fatalf("Java consumed %v; it should start at runnel's committed offset 1", ev)
			}
			theirs[q] = true
		}
		if len(theirs) != 2 {
			t.Fatalf("Java consumed from queues %v, want the 2 runnel does not own", theirs)
		}
		// The Java consumer left (shutdown unregisters): runnel takes all.
		waitAssigned(t, "runnel after the Java member left", g, 4)
		offs, err := cl.ConsumerOffsets(ctx, group, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			off, err := cl.QueryConsumerOffset(ctx, group, q)
			if err != nil {
				t.Fatal(err)
			}
			// Runnel's commits stay; the Java consumer's queues are at 2, or
			// still at 1: the driver's push command ends (and the consumer
			// persists its offsets) as soon as its listener has seen the
			// messages, possibly before the client advanced its offsets.
			if off != 1 && !(theirs[q.QueueID] && off == 2) {
				t.Fatalf("offset of %s after the Java consumer: %d (Java consumed from %v)", q, off, theirs)
			}
			if w := offs[q]; w.ConsumerOffset != off || w.BrokerOffset != 2 {
				t.Fatalf("ConsumerOffsets[%s] = %+v, want consumer %d broker 2", q, w, off)
			}
		}
	})
}

// lockOpts are the options of a locking member that wants every queue of
// qs, renews every 500 ms and trusts a lock for 2 s (below lockLifetime).
func lockOpts(qs []protocol.MessageQueue, lost chan<- []protocol.MessageQueue) []client.GroupOption {
	return []client.GroupOption{client.WithQueueLocking(true), client.WithAllocator(client.AllocateByConfig(qs...)),
		client.WithRebalanceInterval(time.Second), client.WithLockRenewInterval(500 * time.Millisecond),
		client.WithLockValidity(2 * time.Second), client.WithListener(client.ListenerFuncs{
			LockLost: func(_ context.Context, q []protocol.MessageQueue) { lost <- q }})}
}

// holdsFor checks for d that a owns every queue of qs and b none.
func holdsFor(t *testing.T, d time.Duration, a, b *client.GroupConsumer, qs []protocol.MessageQueue, lost <-chan []protocol.MessageQueue) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if n := len(a.Assignment()); n != len(qs) {
			t.Fatalf("a owns %d queues while renewing its locks", n)
		}
		if n := len(b.Assignment()); n != 0 {
			t.Fatalf("b owns %d queues locked by a", n)
		}
		select {
		case q := <-lost:
			t.Fatalf("lock of %v lost while renewed", q)
		default:
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestJavaBrokerGroupLocks: in locking mode the Java broker's
// LOCK_BATCH_MQ grants a queue to one client id only: a second member that
// wants the same queues gets none while the first renews its locks, and
// gets them once the first unlocks (UNLOCK_BATCH_MQ on Close).
func TestJavaBrokerGroupLocks(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		admin := newJavaClient(t, c)
		topic := uniqueName(t, "lock")
		qs := createJavaTopic(t, admin, c, topic, 2)
		group := uniqueName(t, "g")
		lost := make(chan []protocol.MessageQueue, 4)
		ga := startGroup(t, newJavaClient(t, c, client.WithInstanceName("a")), group, topic, lockOpts(qs, lost)...)
		waitAssigned(t, "a", ga, 2)
		gb := startGroup(t, newJavaClient(t, c, client.WithInstanceName("b")), group, topic, lockOpts(qs, lost)...)
		// Longer than a's validity: renewals keep a's locks, b gets none.
		holdsFor(t, 3*time.Second, ga, gb, qs, lost)
		if err := ga.Close(); err != nil {
			t.Fatal(err)
		}
		waitAssigned(t, "b after a unlocked", gb, 2)
	})
}

// TestJavaBrokerGroupLockExpiry, on a broker whose lock lifetime is
// lockLifetime (3 s): renewals keep a member's locks for twice that, and
// when the member stops without unlocking (its client closes), the broker
// grants the locks to the other member only once they expired.
func TestJavaBrokerGroupLockExpiry(t *testing.T) {
	eachRestricted(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		admin := newJavaClient(t, c, adminCreds())
		topic := uniqueName(t, "expiry")
		qs := createJavaTopic(t, admin, c, topic, 2)
		group := uniqueName(t, "g")
		lost := make(chan []protocol.MessageQueue, 4)
		ca := newJavaClient(t, c, adminCreds(), client.WithInstanceName("a"))
		ga := startGroup(t, ca, group, topic, lockOpts(qs, lost)...)
		waitAssigned(t, "a", ga, 2)
		gb := startGroup(t, newJavaClient(t, c, adminCreds(), client.WithInstanceName("b")), group, topic, lockOpts(qs, lost)...)
		holdsFor(t, 2*lockLifetime, ga, gb, qs, lost)
		// a's last renewal was at most 500 ms before this.
		stopped := time.Now()
		_ = ca.Close()
		waitAssigned(t, "b after a's locks expired", gb, 2)
		if el := time.Since(stopped); el < lockLifetime-time.Second {
			t.Fatalf("b got a's locks %v after a stopped renewing, before the %v lifetime", el, lockLifetime)
		}
	})
}
