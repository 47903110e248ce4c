package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/internal/testutil/testcert"
	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// send sends one message with body to queue q of its topic through c.
func send(t *testing.T, ctx context.Context, c *client.Client, q protocol.MessageQueue, body string) {
	t.Helper()
	p, err := client.NewProducer(c, "embedded_test", client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Send(ctx, &client.Message{Topic: q.Topic, Body: []byte(body), Queue: &q}); err != nil {
		t.Fatal(err)
	}
}

// TestEmbeddedStartDefault: one broker named broker-a in DefaultCluster,
// registered when Start returns (TBW102 routable without polling), a topic
// made routable by CreateTopic, messages stored and read back, and Close
// removing the temporary data directory, idempotently.
func TestEmbeddedStartDefault(t *testing.T) {
	ctx := testCtx(t)
	cl, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := cl.DataDir()
	if len(cl.Brokers()) != 1 || cl.Broker(0).Name() != broker.DefaultBrokerName || cl.BrokerAddr() != cl.Broker(0).Addr() {
		t.Fatalf("brokers %v, broker 0 %q at %s", cl.Brokers(), cl.Broker(0).Name(), cl.BrokerAddr())
	}
	c := cl.Client()
	r, err := c.RefreshRoute(ctx, "TBW102")
	if err != nil || len(r.PublishQueues()) == 0 {
		t.Fatalf("TBW102 route %v, %v", r, err)
	}
	ci, err := c.ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names := ci.ClusterAddrTable[DefaultClusterName]; len(names) != 1 || names[0] != "broker-a" {
		t.Fatalf("cluster %s has brokers %v", DefaultClusterName, ci.ClusterAddrTable)
	}
	if err := cl.CreateTopic(ctx, "orders", 3); err != nil {
		t.Fatal(err)
	}
	// No polling: CreateTopic returns once the route shows every queue.
	r, err = c.Route(ctx, "orders")
	if err != nil || len(r.PublishQueues()) != 3 || len(r.SubscribeQueues()) != 3 {
		t.Fatalf("orders route %v, %v", r, err)
	}
	q := r.PublishQueues()[2]
	send(t, ctx, c, q, "hello")
	res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, MaxMsgs: 10, Group: "embedded_test"})
	if err != nil || len(res.Messages) != 1 || string(res.Messages[0].Body) != "hello" {
		t.Fatalf("pull = %+v, %v", res, err)
	}
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("data directory %s after Close: %v", dir, err)
	}
}

// TestEmbeddedSeveralBrokers: three brokers of one cluster, distinct names
// and ports; WithTopic puts a topic's queues on each and a message sent to
// a queue of each broker is stored by that broker.
func TestEmbeddedSeveralBrokers(t *testing.T) {
	ctx := testCtx(t)
	cl := Run(t, WithBrokers(3), WithClusterName("three"), WithTopic("spread", 2))
	bs := cl.Brokers()
	if len(bs) != 3 {
		t.Fatalf("%d brokers", len(bs))
	}
	seen := map[string]bool{}
	for i, b := range bs {
		if b.Name() != BrokerName(i) || seen[b.Addr()] {
			t.Fatalf("broker %d: %q at %s (seen %v)", i, b.Name(), b.Addr(), seen)
		}
		seen[b.Addr()] = true
	}
	c := cl.Client()
	ci, err := c.ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names := ci.ClusterAddrTable["three"]; len(names) != 3 {
		t.Fatalf("cluster three has %v", ci.ClusterAddrTable)
	}
	r, err := c.Route(ctx, "spread")
	if err != nil || len(r.PublishQueues()) != 6 {
		t.Fatalf("route %v, %v", r, err)
	}
	for _, q := range r.PublishQueues() {
		if q.QueueID == 1 {
			send(t, ctx, c, q, q.BrokerName)
		}
	}
	for _, b := range bs {
		q := protocol.MessageQueue{Topic: "spread", BrokerName: b.Name(), QueueID: 1}
		if n, err := c.MaxOffset(ctx, q); err != nil || n != 1 {
			t.Fatalf("%s max offset %d, %v", q, n, err)
		}
		if st := b.Server().Stats(); st.SendRequests < 1 {
			t.Fatalf("%s stats %+v", b.Name(), st)
		}
	}
}

// TestEmbeddedDataDirReopen: with WithDataDir a second cluster on the same
// directory finds the first one's topic and messages, and Close leaves the
// directory in place.
func TestEmbeddedDataDirReopen(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cl, err := Start(ctx, WithDataDir(dir), WithTopic("kept", 1))
	if err != nil {
		t.Fatal(err)
	}
	send(t, ctx, cl.Client(), protocol.MessageQueue{Topic: "kept", BrokerName: "broker-a", QueueID: 0}, "m")
	if err := cl.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "broker-a")); err != nil {
		t.Fatalf("broker data after Shutdown: %v", err)
	}
	cl2 := Run(t, WithDataDir(dir))
	q := protocol.MessageQueue{Topic: "kept", BrokerName: "broker-a", QueueID: 0}
	if n, err := cl2.Client().MaxOffset(ctx, q); err != nil || n != 1 {
		t.Fatalf("after reopening: max offset %d, %v", n, err)
	}
}

// TestEmbeddedFaultHooks: a one-shot hook answers the next request of its
// code on any broker and is gone; a broker's hook affects only that
// broker; a kept hook answers until removed; a hook's error becomes the
// response code of its *protocol.Error.
func TestEmbeddedFaultHooks(t *testing.T) {
	ctx := testCtx(t)
	cl := Run(t, WithBrokers(2), WithTopic("hooked", 1))
	c := cl.Client()
	qa := protocol.MessageQueue{Topic: "hooked", BrokerName: "broker-a", QueueID: 0}
	qb := protocol.MessageQueue{Topic: "hooked", BrokerName: "broker-b", QueueID: 0}
	busy := func(err error) bool { return errors.Is(err, protocol.ErrSystemBusy) }

	cl.Control(protocol.ReqGetMaxOffset, remoting.RespondWith(protocol.ResSystemBusy, "hooked"))
	if _, err := c.MaxOffset(ctx, qb); !busy(err) {
		t.Fatalf("first max offset: %v, want SYSTEM_BUSY", err)
	}
	if _, err := c.MaxOffset(ctx, qb); err != nil {
		t.Fatalf("after the one-shot hook: %v", err)
	}

	remove := cl.Broker(0).KeepControl(protocol.ReqGetMaxOffset, func(*remoting.RequestCtx) (*protocol.Command, error, bool) {
		return nil, &protocol.Error{Code: protocol.ResNoPermission, Remark: "denied by hook"}, true
	})
	for range 2 {
		if _, err := c.MaxOffset(ctx, qa); !errors.Is(err, protocol.ErrNoPermission) {
			t.Fatalf("broker-a with a kept hook: %v, want NO_PERMISSION", err)
		}
		if _, err := c.MaxOffset(ctx, qb); err != nil {
			t.Fatalf("broker-b: %v", err)
		}
	}
	remove()
	if _, err := c.MaxOffset(ctx, qa); err != nil {
		t.Fatalf("broker-a after remove: %v", err)
	}

	// A hook that lets the request go on (handled=false) sees it and the
	// processor still answers.
	seen := make(chan int32, 1)
	cl.Control(AnyCode, func(rc *remoting.RequestCtx) (*protocol.Command, error, bool) {
		seen <- rc.Request().Code
		return nil, nil, false
	})
	if _, err := c.MaxOffset(ctx, qa); err != nil {
		t.Fatal(err)
	}
	if code := <-seen; code != protocol.ReqGetMaxOffset {
		t.Fatalf("hook saw code %d", code)
	}
}

// TestEmbeddedACL: with WithACL the brokers register (signed by the admin
// account), the cluster's client works, and an unsigned client is refused.
func TestEmbeddedACL(t *testing.T) {
	ctx := testCtx(t)
	admin := acl.Credentials{AccessKey: "embedded-admin", SecretKey: "embedded-admin-secret"}
	p, err := acl.NewPolicy(&acl.Config{Accounts: []acl.Account{{AccessKey: admin.AccessKey, SecretKey: admin.SecretKey, Admin: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, WithACL(p, acl.Credentials{})); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("ACL without admin credentials: %v", err)
	}
	cl := Run(t, WithACL(p, admin), WithTopic("secured", 1))
	anon, err := cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.ClusterInfo(ctx); !errors.Is(err, protocol.ErrNoPermission) {
		t.Fatalf("unsigned cluster info: %v, want NO_PERMISSION", err)
	}
	if _, err := cl.Client().ClusterInfo(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestEmbeddedTLS: with enforcing TLS the brokers register with the name
// server over TLS pinned to the cluster's certificate, the cluster's client
// and a client of ClientOptions work, and a plain-TCP client does not.
func TestEmbeddedTLS(t *testing.T) {
	ctx := testCtx(t)
	cert := testcert.New(t, "embedded")
	cl := Run(t, WithTLS(acl.TLSEnforcing, cert.ServerTLS()), WithTopic("private", 1))
	c, err := cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Route(ctx, "private"); err != nil {
		t.Fatal(err)
	}
	plain, err := client.New(client.WithNameServers(cl.NameServer()), client.WithDialTimeout(time.Second), client.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.RefreshRoute(ctx, "private"); err == nil {
		t.Fatal("a plain-TCP client got a route from an enforcing-TLS name server")
	}
}

// TestEmbeddedExternalNameServers: a cluster of a name server alone, and a
// second one whose broker registers with it.
func TestEmbeddedExternalNameServers(t *testing.T) {
	ctx := testCtx(t)
	ns := Run(t, WithBrokers(0))
	if ns.Namesrv() == nil || len(ns.Brokers()) != 0 {
		t.Fatalf("name server only: %v, %v", ns.Namesrv(), ns.Brokers())
	}
	if err := ns.CreateTopic(ctx, "t", 1); err == nil {
		t.Fatal("CreateTopic without a broker succeeded")
	}
	b := Run(t, WithExternalNameServers(ns.NameServer()), WithClusterName("remote"))
	if b.Namesrv() != nil || b.NameServer() != ns.NameServer() {
		t.Fatalf("external: namesrv %v, address %s", b.Namesrv(), b.NameServer())
	}
	poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
		ci, err := ns.Client().ClusterInfo(ctx)
		if err != nil {
			return err
		}
		if len(ci.ClusterAddrTable["remote"]) != 1 {
			return fmt.Errorf("the name server lists clusters %v", ci.ClusterAddrTable)
		}
		return nil
	})
}

// TestEmbeddedInvalidOptions: unusable options fail Start with
// ErrInvalidOption and leave nothing running (goleak in TestMain).
func TestEmbeddedInvalidOptions(t *testing.T) {
	ctx := testCtx(t)
	for name, opts := range map[string][]Option{
		"negative brokers":   {WithBrokers(-1)},
		"nothing to run":     {WithBrokers(0), WithExternalNameServers("127.0.0.1:1")},
		"topic no broker":    {WithBrokers(0), WithTopic("t", 1)},
		"topic zero queues":  {WithTopic("t", 0)},
		"tls without config": {WithTLS(acl.TLSEnforcing, nil)},
	} {
		if _, err := Start(ctx, opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	// A broker option New refuses: Start fails and stops the name server.
	if _, err := Start(ctx, WithBrokerOptions(broker.WithMaxMessageSize(0))); !errors.Is(err, broker.ErrInvalidOption) {
		t.Errorf("bad broker option: %v", err)
	}
}

// TestEmbeddedEnsureTopic: EnsureTopic creates a missing topic on the
// target (a broker address, or the cluster name) and returns once it is
// routable, and leaves an existing topic as it is.
func TestEmbeddedEnsureTopic(t *testing.T) {
	ctx := testCtx(t)
	cl := Run(t, WithBrokers(2))
	c, err := cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := EnsureTopic(ctx, c, cl.BrokerAddr(), "on-a", 3); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Route(ctx, "on-a"); err != nil || len(r.SubscribeQueues()) != 3 || r.SubscribeQueues()[0].BrokerName != "broker-a" {
		t.Fatalf("on-a route %v, %v", r, err)
	}
	if err := EnsureTopic(ctx, c, DefaultClusterName, "on-both", 2); err != nil {
		t.Fatal(err)
	}
	// The route may show one broker's queues before the other's: poll.
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		r, err := c.RefreshRoute(ctx, "on-both")
		if err != nil {
			return err
		}
		if err := routable(r, cl.Brokers(), 2); err != nil {
			return err
		}
		return nil
	})
	// Existing: not recreated with other queue counts.
	if err := EnsureTopic(ctx, c, cl.BrokerAddr(), "on-a", 5); err != nil {
		t.Fatal(err)
	}
	if r, err := c.RefreshRoute(ctx, "on-a"); err != nil || len(r.SubscribeQueues()) != 3 {
		t.Fatalf("on-a after a second EnsureTopic: %v, %v", r, err)
	}
}
