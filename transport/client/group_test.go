package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// groupTestLogger logs to stderr when CLIENT_TEST_LOG is set.
func groupTestLogger() *slog.Logger {
	if os.Getenv("CLIENT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// groupCluster is a real name server with real brokers on loopback.
type groupCluster struct {
	ns      *namesrv.Server
	brokers []*broker.Broker
}

// startGroupCluster starts a name server and n brokers ("broker-a", …),
// all stopped at the end of the test. It registers the leak check first so
// that it runs after every other cleanup.
func startGroupCluster(t *testing.T, n int, opts ...broker.Option) *groupCluster {
	t.Helper()
	return startGroupClusterNS(t, n, nil, opts...)
}

// startGroupClusterNS is startGroupCluster with options for the name
// server too.
func startGroupClusterNS(t *testing.T, n int, nsOpts []namesrv.Option, opts ...broker.Option) *groupCluster {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := namesrv.New(append([]namesrv.Option{namesrv.WithListenAddr("127.0.0.1:0"), namesrv.WithKVConfigDir(t.TempDir())}, nsOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	gc := &groupCluster{ns: ns}
	for i := range n {
		b, err := broker.New(append([]broker.Option{broker.WithDataDir(t.TempDir()), broker.WithListenAddr("127.0.0.1:0"),
			broker.WithNameServers(ns.Addr()), broker.WithBrokerName("broker-" + string(rune('a'+i))),
			broker.WithLogger(groupTestLogger())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = b.Shutdown(ctx) // a test may have shut it down already
		})
		gc.brokers = append(gc.brokers, b)
	}
	return gc
}

// client returns a new Client of the cluster, closed at the end of the test.
func (gc *groupCluster) client(t *testing.T) *Client {
	t.Helper()
	c, err := New(WithNameServers(gc.ns.Addr()), WithLogger(groupTestLogger()), WithClientIP(netip.MustParseAddr("127.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// createTopic creates topic with perBroker queues on every broker and waits
// until the route shows all of them.
func (gc *groupCluster) createTopic(t *testing.T, c *Client, topic string, perBroker int) []protocol.MessageQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range gc.brokers {
		req := protocol.NewRequest(protocol.ReqUpdateAndCreateTopic)
		h := protocol.CreateTopicRequestHeader{Topic: topic, DefaultTopic: DefaultTopic, ReadQueueNums: int32(perBroker),
			WriteQueueNums: int32(perBroker), Perm: 6, TopicFilterType: "SINGLE_TAG"}
		h.Encode(req)
		resp, err := c.invoke(ctx, b.Addr(), req)
		if err == nil {
			err = protocol.ResponseError(resp)
		}
		if err != nil {
			t.Fatalf("create topic on %s: %v", b.Addr(), err)
		}
	}
	want := perBroker * len(gc.brokers)
	var qs []protocol.MessageQueue
	groupCheckFor(t, 10*time.Second, func() error {
		r, err := c.RefreshRoute(ctx, topic)
		if err != nil {
			return err
		}
		if qs = r.SubscribeQueues(); len(qs) != want {
			return fmt.Errorf("route has %d queues, want %d", len(qs), want)
		}
		return nil
	})
	return slices.Clone(qs)
}

// groupCheckFor polls f until it returns nil or total elapses.
func groupCheckFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", total, err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// ownershipChecker records every listener call of every member and checks
// that no queue is ever owned by two members at once (strict) and that each
// member's calls are consistent (revoke only what it owns, assign only what
// it does not).
type ownershipChecker struct {
	t      *testing.T
	strict bool
	// revokeWork is how long OnRevoke takes (simulated flushing), which
	// widens the window in which an unfenced new owner would overlap.
	revokeWork time.Duration
	mu         sync.Mutex
	owner      map[protocol.MessageQueue]string
	owned      map[string]map[protocol.MessageQueue]bool
	events     []string
	errs       []string
}

func newOwnershipChecker(t *testing.T, strict bool) *ownershipChecker {
	return &ownershipChecker{t: t, strict: strict, owner: map[protocol.MessageQueue]string{},
		owned: map[string]map[protocol.MessageQueue]bool{}}
}

func (oc *ownershipChecker) failf(format string, args ...any) {
	oc.errs = append(oc.errs, fmt.Sprintf(format, args...))
}

func (oc *ownershipChecker) listener(member string) ListenerFuncs {
	log := func(kind string, qs []protocol.MessageQueue) {
		oc.events = append(oc.events, fmt.Sprintf("%s %s %s %v", time.Now().Format("15:04:05.000"), member, kind, qs))
	}
	mine := func() map[protocol.MessageQueue]bool {
		if oc.owned[member] == nil {
			oc.owned[member] = map[protocol.MessageQueue]bool{}
		}
		return oc.owned[member]
	}
	release := func(kind string, qs []protocol.MessageQueue) {
		oc.mu.Lock()
		defer oc.mu.Unlock()
		log(kind, qs)
		for _, q := range qs {
			if !mine()[q] {
				oc.failf("%s: %s of %s it does not own", member, kind, q)
			}
			delete(mine(), q)
			if oc.owner[q] == member {
				delete(oc.owner, q)
			}
		}
	}
	return ListenerFuncs{
		Assign: func(_ context.Context, qs []protocol.MessageQueue) {
			oc.mu.Lock()
			defer oc.mu.Unlock()
			log("assign", qs)
			for _, q := range qs {
				if mine()[q] {
					oc.failf("%s: assigned %s twice", member, q)
				}
				if o, ok := oc.owner[q]; ok && o != member && oc.strict {
					oc.failf("%s: assigned %s still owned by %s", member, q, o)
				}
				mine()[q] = true
				oc.owner[q] = member
			}
		},
		Revoke: func(ctx context.Context, qs []protocol.MessageQueue) {
			if oc.revokeWork > 0 {
				work := time.NewTimer(oc.revokeWork)
				select {
				case <-work.C:
				case <-ctx.Done():
				}
				work.Stop()
			}
			release("revoke", qs)
		},
		LockLost: func(_ context.Context, qs []protocol.MessageQueue) { release("lock-lost", qs) },
	}
}

// check fails the test on any recorded violation.
func (oc *ownershipChecker) check() {
	oc.t.Helper()
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if len(oc.errs) > 0 {
		oc.t.Fatalf("ownership violations:\n%s\nevents:\n%s", strings.Join(oc.errs, "\n"), strings.Join(oc.events, "\n"))
	}
}

// ownedBy returns the queues the listener calls say member owns.
func (oc *ownershipChecker) ownedBy(member string) []protocol.MessageQueue {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	var out []protocol.MessageQueue
	for q := range oc.owned[member] {
		out = append(out, q)
	}
	slices.SortFunc(out, protocol.MessageQueue.Compare)
	return out
}

type groupMember struct {
	c *Client
	g *GroupConsumer
}

// groupConverged returns nil when every member owns exactly its averagely share
// (by Assignment and by its listener calls) and the allocShares partition all.
func groupConverged(oc *ownershipChecker, members []groupMember, all []protocol.MessageQueue) error {
	var ids []string
	for _, m := range members {
		ids = append(ids, m.c.ClientID())
	}
	slices.Sort(ids)
	seen := map[protocol.MessageQueue]bool{}
	for _, m := range members {
		want := AllocateAveragely().Allocate(m.c.ClientID(), ids, all)
		if got := m.g.Assignment(); !slices.Equal(got, want) {
			return fmt.Errorf("%s: assignment %v, want %v", m.c.ClientID(), got, want)
		}
		if got := oc.ownedBy(m.c.ClientID()); !slices.Equal(got, want) {
			return fmt.Errorf("%s: listener says %v, want %v", m.c.ClientID(), got, want)
		}
		for _, q := range want {
			seen[q] = true
		}
	}
	if len(seen) != len(all) {
		return fmt.Errorf("%d of %d queues owned", len(seen), len(all))
	}
	return nil
}

func TestGroupRebalanceMembership(t *testing.T) {
	for _, locking := range []bool{true, false} {
		t.Run(fmt.Sprintf("locking=%v", locking), func(t *testing.T) {
			gc := startGroupCluster(t, 2)
			admin := gc.client(t)
			all := gc.createTopic(t, admin, "group-topic", 4)
			oc := newOwnershipChecker(t, locking)
			oc.revokeWork = 100 * time.Millisecond
			join := func() groupMember {
				c := gc.client(t)
				g, err := NewGroupConsumer(c, "group-rb", WithQueueLocking(locking), WithListener(oc.listener(c.ClientID())),
					WithLockRenewInterval(time.Second), WithLockValidity(3*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if err := g.Subscribe("group-topic", "*"); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := g.Start(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = g.Close() })
				return groupMember{c, g}
			}
			var members []groupMember
			step := func(name string) {
				t.Helper()
				start := time.Now()
				groupCheckFor(t, 15*time.Second, func() error {
					oc.check()
					return groupConverged(oc, members, all)
				})
				t.Logf("%s: groupConverged in %v", name, time.Since(start))
			}
			members = append(members, join())
			step("1 member")
			members = append(members, join())
			step("2 members")
			members = append(members, join())
			step("3 members")
			leaving := members[1]
			if err := leaving.g.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := leaving.g.Assignment(); len(got) != 0 {
				t.Fatalf("closed member still owns %v", got)
			}
			members = slices.Delete(members, 1, 2)
			step("2 members again")
			for _, m := range members {
				if err := m.g.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}
			oc.check()
			t.Logf("events:\n%s", oc.dump())
			for _, m := range members {
				if got := oc.ownedBy(m.c.ClientID()); len(got) != 0 {
					t.Fatalf("%s still owns %v after Close", m.c.ClientID(), got)
				}
			}
		})
	}
}

// A joining member makes the others rebalance at once (broker
// notification), not at the next 20 s timer.
func TestGroupNotifyTriggersRebalance(t *testing.T) {
	gc := startGroupCluster(t, 1)
	admin := gc.client(t)
	all := gc.createTopic(t, admin, "notify-topic", 8)
	oc := newOwnershipChecker(t, false)
	var members []groupMember
	for range 2 {
		c := gc.client(t)
		g, err := NewGroupConsumer(c, "group-notify", WithListener(oc.listener(c.ClientID())),
			WithRebalanceInterval(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Subscribe("notify-topic", "*"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		members = append(members, groupMember{c, g})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := members[0].g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := members[0].g.Assignment(); len(got) != len(all) {
		t.Fatalf("single member owns %v", got)
	}
	start := time.Now()
	if err := members[1].g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	groupCheckFor(t, 3*time.Second, func() error { return groupConverged(oc, members, all) })
	t.Logf("rebalanced %v after the second member started", time.Since(start).Round(time.Millisecond))
	// And a leaving member hands its queues back at once.
	if err := members[1].g.Close(); err != nil {
		t.Fatal(err)
	}
	groupCheckFor(t, 3*time.Second, func() error { return groupConverged(oc, members[:1], all) })
	oc.check()
}

// Locks that can no longer be renewed are reported lost within the
// validity, and the queues leave the assignment.
func TestGroupLockLost(t *testing.T) {
	gc := startGroupCluster(t, 1)
	admin := gc.client(t)
	all := gc.createTopic(t, admin, "lock-topic", 4)
	c := gc.client(t)
	oc := newOwnershipChecker(t, true)
	var lostMu sync.Mutex
	var lostAt time.Time
	var lost []protocol.MessageQueue
	l := oc.listener(c.ClientID())
	inner := l.LockLost
	l.LockLost = func(ctx context.Context, qs []protocol.MessageQueue) {
		inner(ctx, qs)
		lostMu.Lock()
		lost = append(lost, qs...)
		lostAt = time.Now()
		lostMu.Unlock()
	}
	const validity = 1500 * time.Millisecond
	g, err := NewGroupConsumer(c, "group-lock", WithQueueLocking(true), WithListener(l),
		WithLockRenewInterval(300*time.Millisecond), WithLockValidity(validity), WithGroupTimeout(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe("lock-topic", "*"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if got := g.Assignment(); !slices.Equal(got, all) {
		t.Fatalf("assignment %v, want %v", got, all)
	}
	// Renewals keep the locks for several validity periods.
	renewedUntil := time.Now().Add(validity + 500*time.Millisecond)
	groupCheckFor(t, 5*time.Second, func() error {
		if n := len(g.Assignment()); n != len(all) {
			t.Fatalf("lost locks while the broker runs: %d of %d left", n, len(all))
		}
		if time.Now().Before(renewedUntil) {
			return errors.New("still waiting")
		}
		return nil
	})
	// The broker stops answering.
	stopped := time.Now()
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if err := gc.brokers[0].Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	groupCheckFor(t, 2*validity+2*time.Second, func() error {
		lostMu.Lock()
		defer lostMu.Unlock()
		if len(lost) != len(all) {
			return fmt.Errorf("%d of %d locks reported lost", len(lost), len(all))
		}
		return nil
	})
	lostMu.Lock()
	after := lostAt.Sub(stopped)
	lostMu.Unlock()
	t.Logf("locks reported lost %v after the broker stopped", after.Round(time.Millisecond))
	if after > validity+time.Second {
		t.Fatalf("lock loss reported %v after the broker stopped; validity is %v", after, validity)
	}
	if got := g.Assignment(); len(got) != 0 {
		t.Fatalf("assignment after lock loss: %v", got)
	}
	oc.check()
	_ = g.Close() // the broker is gone: unlock and unregister fail
}

// An error answer to the member list keeps the current assignment.
func TestGroupMemberListErrorKeepsAssignment(t *testing.T) {
	gc := startGroupCluster(t, 1)
	admin := gc.client(t)
	all := gc.createTopic(t, admin, "keep-topic", 4)
	c := gc.client(t)
	oc := newOwnershipChecker(t, false)
	g, err := NewGroupConsumer(c, "group-keep", WithListener(oc.listener(c.ClientID())), WithRebalanceInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe("keep-topic", "*"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if got := g.Assignment(); !slices.Equal(got, all) {
		t.Fatalf("assignment %v, want %v", got, all)
	}
	// Remove this client from the group on the broker: the member list
	// answer is now an error (no consumer) or lacks this client.
	req := protocol.NewRequest(protocol.ReqUnregisterClient)
	h := protocol.UnregisterClientRequestHeader{ClientID: c.ClientID(), ConsumerGroup: "group-keep"}
	h.Encode(req)
	resp, err := c.invoke(ctx, gc.brokers[0].Addr(), req)
	if err == nil {
		err = protocol.ResponseError(resp)
	}
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.consumerList(ctx, gc.brokers[0].Addr())
	t.Logf("member list after unregistering: %v", err)
	if err == nil {
		t.Fatal("member list succeeded for a group without members")
	}
	g.rebalance(ctx)
	if got := g.Assignment(); !slices.Equal(got, all) {
		t.Fatalf("assignment after a member-list error: %v", got)
	}
	// With the broker gone altogether (transport errors) too.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if err := gc.brokers[0].Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	g.rebalance(ctx)
	if got := g.Assignment(); !slices.Equal(got, all) {
		t.Fatalf("assignment after a transport error: %v", got)
	}
	oc.check()
	if got := oc.ownedBy(c.ClientID()); !slices.Equal(got, all) {
		t.Fatalf("listener was told of changes: %v", got)
	}
	_ = g.Close()
}

// Broadcasting members own every queue, without asking for member lists.
func TestGroupBroadcasting(t *testing.T) {
	gc := startGroupCluster(t, 2)
	admin := gc.client(t)
	all := gc.createTopic(t, admin, "bcast-topic", 2)
	var gs []*GroupConsumer
	for range 2 {
		c := gc.client(t)
		g, err := NewGroupConsumer(c, "group-bcast", WithBroadcasting())
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Subscribe("bcast-topic", "*"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = g.Start(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		gs = append(gs, g)
	}
	for _, g := range gs {
		if got := g.Assignment(); !slices.Equal(got, all) {
			t.Fatalf("broadcasting assignment %v, want %v", got, all)
		}
	}
}

func TestGroupConsumerLifecycle(t *testing.T) {
	gc := startGroupCluster(t, 1)
	admin := gc.client(t)
	gc.createTopic(t, admin, "life-topic", 1)
	c := gc.client(t)
	for _, tc := range []struct {
		name  string
		group string
		opts  []GroupOption
	}{
		{"empty group", "", nil},
		{"bad group", "a b", nil},
		{"nil allocator", "g", []GroupOption{WithAllocator(nil)}},
		{"zero interval", "g", []GroupOption{WithRebalanceInterval(0)}},
		{"locking broadcast", "g", []GroupOption{WithQueueLocking(true), WithBroadcasting()}},
		{"validity below renew", "g", []GroupOption{WithQueueLocking(true), WithLockRenewInterval(time.Second), WithLockValidity(time.Second)}},
		{"locking without lock-loss listener", "g", []GroupOption{WithQueueLocking(true), WithListener(groupAssignOnly{})}},
	} {
		if _, err := NewGroupConsumer(c, tc.group, tc.opts...); err == nil {
			t.Errorf("%s: NewGroupConsumer succeeded", tc.name)
		}
	}
	g, err := NewGroupConsumer(c, "group-life")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Start(ctx); !errors.Is(err, ErrNoSubscription) {
		t.Fatalf("Start without subscription: %v", err)
	}
	if err := g.Subscribe("no-such-topic", "*"); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err == nil || !errors.Is(err, protocol.ErrTopicNotExist) {
		t.Fatalf("Start with a missing topic: %v", err)
	}
	g2, err := NewGroupConsumer(c, "group-life")
	if err != nil {
		t.Fatal(err)
	}
	if err := g2.Subscribe("life-topic", "TagA || TagB"); err != nil {
		t.Fatal(err)
	}
	if err := g2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g2.Start(ctx); !errors.Is(err, ErrGroupStarted) {
		t.Fatalf("second Start: %v", err)
	}
	if err := g2.Subscribe("life-topic", "*"); !errors.Is(err, ErrGroupStarted) {
		t.Fatalf("Subscribe after Start: %v", err)
	}
	cd := g2.consumerData()
	if cd.ConsumeType != protocol.ConsumeActively || cd.MessageModel != protocol.MessageModelClustering ||
		len(cd.SubscriptionDataSet) != 1 || !slices.Equal(cd.SubscriptionDataSet[0].TagsSet, []string{"TagA", "TagB"}) {
		t.Fatalf("consumer data %+v", cd)
	}
	if len(g2.Assignment()) != 1 {
		t.Fatalf("assignment %v", g2.Assignment())
	}
	if err := g2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g2.Start(ctx); !errors.Is(err, ErrGroupClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
	if err := g.Close(); err != nil { // never started
		t.Fatal(err)
	}
}

type groupAssignOnly struct{}

func (groupAssignOnly) OnAssign(context.Context, []protocol.MessageQueue) {}
func (groupAssignOnly) OnRevoke(context.Context, []protocol.MessageQueue) {}

func (oc *ownershipChecker) dump() string {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	return strings.Join(oc.events, "\n")
}

// A renewal the broker refuses (another client took the lock after it
// expired on the broker) is reported at once, long before the validity.
func TestGroupLockDenied(t *testing.T) {
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	gc := startGroupCluster(t, 1, broker.WithClock(clock))
	admin := gc.client(t)
	all := gc.createTopic(t, admin, "deny-topic", 2)
	c := gc.client(t)
	oc := newOwnershipChecker(t, true)
	l := oc.listener(c.ClientID())
	lostCh := make(chan []protocol.MessageQueue, 4)
	inner := l.LockLost
	l.LockLost = func(ctx context.Context, qs []protocol.MessageQueue) {
		inner(ctx, qs)
		lostCh <- qs
	}
	const renew, validity = time.Second, 20 * time.Second
	g, err := NewGroupConsumer(c, "group-deny", WithQueueLocking(true), WithListener(l),
		WithLockRenewInterval(renew), WithLockValidity(validity))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Subscribe("deny-topic", "*"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if got := g.Assignment(); !slices.Equal(got, all) {
		t.Fatalf("assignment %v", got)
	}
	// Age the broker's locks past its 60 s expiry and let another client
	// take them (retrying should a renewal slip in between).
	thief := func() []protocol.MessageQueue {
		body := protocol.LockBatchRequestBody{ConsumerGroup: "group-deny", ClientID: "10.9.9.9@thief", MQSet: all}
		b, err := body.Encode()
		if err != nil {
			t.Fatal(err)
		}
		req := protocol.NewRequest(protocol.ReqLockBatchMq)
		req.Body = b
		resp, err := admin.invoke(ctx, gc.brokers[0].Addr(), req)
		if err == nil {
			err = protocol.ResponseError(resp)
		}
		if err != nil {
			t.Fatal(err)
		}
		var lb protocol.LockBatchResponseBody
		if err := lb.Decode(resp.Body); err != nil {
			t.Fatal(err)
		}
		return lb.LockOKMQSet
	}
	if got := thief(); len(got) != 0 {
		t.Fatalf("another client got fresh locks: %v", got)
	}
	var stolen time.Time
	groupCheckFor(t, 5*time.Second, func() error {
		skew.Add(int64(61 * time.Second))
		if got := thief(); len(got) != len(all) {
			return fmt.Errorf("thief got %v", got)
		}
		stolen = time.Now()
		return nil
	})
	select {
	case qs := <-lostCh:
		after := time.Since(stolen)
		t.Logf("lock loss reported %v after the locks were taken", after)
		if !slices.Equal(qs, all) {
			t.Fatalf("lost %v, want %v", qs, all)
		}
		if after > renew+2*time.Second {
			t.Fatalf("lock loss reported after %v; renewals run every %v", after, renew)
		}
	case <-time.After(renew + 5*time.Second):
		t.Fatal("no lock loss reported")
	}
	if got := g.Assignment(); len(got) != 0 {
		t.Fatalf("assignment after lock loss: %v", got)
	}
	oc.check()
}
