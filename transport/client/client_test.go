package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil/testcert"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// coreEnv is a real name server and real brokers on loopback, for the core
// client tests.
type coreEnv struct {
	t       testing.TB
	ns      *namesrv.Server
	nsOpts  []namesrv.Option
	brokers map[string]*coreBroker
}

type coreBroker struct {
	b    *broker.Broker
	name string
	dir  string
	addr string
	opts []broker.Option
}

// newCoreEnv starts a name server and brokers named names (default
// "broker-a"). The goroutine-leak check is registered first, so it runs
// after every other cleanup.
func newCoreEnv(t testing.TB, names ...string) *coreEnv {
	t.Helper()
	if tt, ok := t.(*testing.T); ok {
		t.Cleanup(func() { goleak.VerifyNone(tt) })
	}
	return newCoreEnvOpts(t, nil, nil, names...)
}

func newCoreEnvOpts(t testing.TB, nsOpts []namesrv.Option, bOpts []broker.Option, names ...string) *coreEnv {
	t.Helper()
	if len(names) == 0 {
		names = []string{"broker-a"}
	}
	e := &coreEnv{t: t, brokers: map[string]*coreBroker{}, nsOpts: nsOpts}
	ns, err := namesrv.New(append([]namesrv.Option{namesrv.WithListenAddr("127.0.0.1:0")}, nsOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ns.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	e.ns = ns
	for _, n := range names {
		e.startBroker(n, t.TempDir(), "127.0.0.1:0", bOpts...)
	}
	return e
}

// startBroker starts (or restarts, with the same dir and address) a broker.
func (e *coreEnv) startBroker(name, dir, addr string, opts ...broker.Option) *coreBroker {
	e.t.Helper()
	all := []broker.Option{broker.WithDataDir(dir), broker.WithListenAddr(addr), broker.WithBrokerName(name),
		broker.WithNameServers(e.ns.Addr()), broker.WithFlushMode(broker.FlushAsync), broker.WithLogger(coreTestLogger())}
	if addr != "127.0.0.1:0" {
		all = append(all, broker.WithAdvertisedAddr(addr))
	}
	all = append(all, opts...)
	b, err := broker.New(all...)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = b.Close() })
	cb := &coreBroker{b: b, name: name, dir: dir, addr: b.Addr(), opts: opts}
	e.brokers[name] = cb
	return cb
}

// stopBroker closes a broker at once (its name-server connection drops, so
// the name server forgets it).
func (e *coreEnv) stopBroker(name string) {
	e.t.Helper()
	if err := e.brokers[name].b.Close(); err != nil {
		e.t.Fatal(err)
	}
}

// restartBroker starts a stopped broker again on its address and data dir.
func (e *coreEnv) restartBroker(name string) *coreBroker {
	e.t.Helper()
	old := e.brokers[name]
	return e.startBroker(name, old.dir, old.addr, old.opts...)
}

// client returns a Client of the environment, closed at the end of the test.
func (e *coreEnv) client(opts ...Option) *Client {
	e.t.Helper()
	all := append([]Option{WithNameServers(e.ns.Addr()), WithClientIP(netip.MustParseAddr("127.0.0.1")),
		WithLogger(coreTestLogger())}, opts...)
	c, err := New(all...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// createTopic creates topic with n queues on every broker and waits for the
// route to show them all.
func (e *coreEnv) createTopic(c *Client, topic string, n int) []protocol.MessageQueue {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range e.brokers {
		if err := c.CreateTopic(ctx, b.addr, TopicConfig{TopicName: topic, ReadQueueNums: int32(n), WriteQueueNums: int32(n)}); err != nil {
			e.t.Fatal(err)
		}
	}
	want := n * len(e.brokers)
	var qs []protocol.MessageQueue
	waitFor(e.t, 10*time.Second, func() error {
		r, err := c.RefreshRoute(ctx, topic)
		if err != nil {
			return err
		}
		if qs = r.PublishQueues(); len(qs) != want {
			return fmt.Errorf("route of %s has %d queues, want %d", topic, len(qs), want)
		}
		return nil
	})
	return qs
}

// waitFor polls f every 20 ms until it returns nil or total elapses.
func waitFor(t testing.TB, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		tm := time.NewTimer(20 * time.Millisecond)
		<-tm.C
	}
}

// deadAddr returns a loopback address nobody listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	_ = l.Close()
	return a
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestClientRouteAndNameServerFailover(t *testing.T) {
	e := newCoreEnv(t)
	// The first name server is dead: lookups fail over to the second.
	c := e.client(WithNameServers(deadAddr(t), e.ns.Addr()))
	ctx := testCtx(t, 20*time.Second)
	e.createTopic(c, "RouteT", 3)
	r, err := c.Route(ctx, "RouteT")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(r.SubscribeQueues()); got != 3 {
		t.Fatalf("subscribe queues %d", got)
	}
	if a, ok := r.MasterAddr("broker-a"); !ok || a != e.brokers["broker-a"].addr {
		t.Fatalf("master %q %v", a, ok)
	}
	if names := r.BrokerNames(); len(names) != 1 || names[0] != "broker-a" {
		t.Fatalf("broker names %v", names)
	}
	if _, err := c.Route(ctx, "NoSuchTopic"); !errors.Is(err, protocol.ErrTopicNotExist) {
		t.Fatalf("unknown topic: %v", err)
	}
	// All name servers dead.
	c2 := e.client(WithNameServers(deadAddr(t)), WithRequestTimeout(500*time.Millisecond))
	if _, err := c2.Route(ctx, "RouteT"); !errors.Is(err, ErrNoNameServer) || !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dead name servers: %v", err)
	}
	if c.ClientID() == c2.ClientID() {
		t.Fatalf("two clients share the id %q", c.ClientID())
	}
}

func TestClientNameServerResolver(t *testing.T) {
	e := newCoreEnv(t)
	var addrs = e.ns.Addr()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, " "+addrs+" ;\n")
	}))
	defer srv.Close()
	c := e.client(WithNameServers(), WithNameServerResolver(srv.URL+"/rocketmq/nsaddr"), WithResolverRefreshInterval(50*time.Millisecond))
	ctx := testCtx(t, 10*time.Second)
	e.createTopic(c, "ResolvedT", 1)
	if got, _ := c.nameServers(); len(got) != 1 || got[0] != addrs {
		t.Fatalf("resolved name servers %v", got)
	}
	if _, err := c.Route(ctx, "ResolvedT"); err != nil {
		t.Fatal(err)
	}
	// A resolver that answers garbage at New fails New.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "not an address") }))
	defer bad.Close()
	if c, err := New(WithNameServerResolver(bad.URL)); err == nil {
		c.Close()
		t.Fatal("New succeeded with a broken resolver and no fallback")
	}
}

func TestClientCloseJoinsAndRefuses(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client(WithHeartbeatInterval(20*time.Millisecond), WithRouteRefreshInterval(20*time.Millisecond))
	e.createTopic(c, "CloseT", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	if _, err := p.Send(ctx, &Message{Topic: "CloseT", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	if !c.goStart("test", func(ctx context.Context) { close(started); <-ctx.Done() }) {
		t.Fatal("goStart refused before Close")
	}
	<-started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.goStart("late", func(context.Context) {}) {
		t.Fatal("goStart accepted after Close")
	}
	if _, err := p.Send(ctx, &Message{Topic: "CloseT", Body: []byte("x")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after Close: %v", err)
	}
	if _, err := c.Route(ctx, "Other"); !errors.Is(err, ErrClosed) {
		t.Fatalf("route after Close: %v", err)
	}
	if _, err := NewProducer(c, "pg2"); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewProducer after Close: %v", err)
	}
}

// TestClientHeartbeatAndServerRequests checks that the broker learns the
// producer group from heartbeats, and that server-initiated requests reach
// handlers.
func TestClientHeartbeatAndServerRequests(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	e.createTopic(c, "HbT", 1)
	p, err := NewProducer(c, "hb-group")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := testCtx(t, 10*time.Second)
	if err := c.heartbeatNow(ctx); err != nil {
		t.Fatal(err)
	}
	// GET_PRODUCER_CONNECTION_LIST is answered by the broker from heartbeats.
	req := protocol.NewRequest(protocol.ReqGetProducerConnectionList)
	req.SetExt("producerGroup", "hb-group")
	resp, err := c.invoke(ctx, e.brokers["broker-a"].addr, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResSuccess || !containsBytes(resp.Body, c.ClientID()) {
		t.Fatalf("producer connections: code %d body %s", resp.Code, resp.Body)
	}
	// Dispatch: every handler runs, the first response wins; unknown codes
	// get REQUEST_CODE_NOT_SUPPORTED.
	var calls []string
	rm1 := c.handleServerRequest(999, func(_ context.Context, addr string, _ *protocol.Command) *protocol.Command {
		calls = append(calls, "1@"+addr)
		return nil
	})
	rm2 := c.handleServerRequest(999, func(_ context.Context, _ string, r *protocol.Command) *protocol.Command {
		calls = append(calls, "2")
		return protocol.NewResponse(r, 0, "two")
	})
	got := c.dispatch(ctx, "b:1", protocol.NewRequest(999))
	if got == nil || got.Remark != "two" || len(calls) != 2 || calls[0] != "1@b:1" {
		t.Fatalf("dispatch: %v %v", got, calls)
	}
	rm1()
	rm2()
	if got := c.dispatch(ctx, "b:1", protocol.NewRequest(999)); got == nil || got.Code != protocol.ResRequestCodeNotSupported {
		t.Fatalf("dispatch after remove: %v", got)
	}
}

func containsBytes(b []byte, s string) bool {
	return len(s) > 0 && string(b) != "" && bytesIndex(b, s) >= 0
}

func bytesIndex(b []byte, s string) int {
	for i := 0; i+len(s) <= len(b); i++ {
		if string(b[i:i+len(s)]) == s {
			return i
		}
	}
	return -1
}

func TestClientTLS(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	cert := testcert.New(t, "runnel test")
	srvTLS := cert.ServerTLS()
	// Name server and broker accept TLS (and plain TCP, for the broker's own
	// registration).
	e := newCoreEnvOpts(t,
		[]namesrv.Option{namesrv.WithRemotingOptions(remoting.WithTLSConfig(srvTLS), remoting.WithPermissiveTLS())},
		[]broker.Option{broker.WithRemotingOptions(remoting.WithTLSConfig(srvTLS), remoting.WithPermissiveTLS())})
	ctx := testCtx(t, 20*time.Second)

	// No ServerName: the client takes it from the address it dials.
	c := e.client(WithTLSConfig(&tls.Config{RootCAs: cert.Pool, MinVersion: tls.VersionTLS12}))
	e.createTopic(c, "TLST", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := p.Send(ctx, &Message{Topic: "TLST", Body: []byte("over tls")})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := c.Pull(ctx, PullRequest{Queue: res.Queue, Offset: res.QueueOffset, Group: "g"})
	if err != nil || pr.Status != PullFound || string(pr.Messages[0].Body) != "over tls" {
		t.Fatalf("pull over TLS: %v %+v", err, pr)
	}

	// Verification is on by default: a client that does not trust the
	// certificate cannot connect.
	c2 := e.client(WithTLSConfig(nil), WithRequestTimeout(2*time.Second))
	_, err = c2.Route(ctx, "TLST")
	var uerr x509.UnknownAuthorityError
	var verr *tls.CertificateVerificationError
	if err == nil || !(errors.As(err, &uerr) || errors.As(err, &verr)) {
		t.Fatalf("untrusted certificate: %v, want a verification error", err)
	}
}

// coreTestLogger logs to stderr when CLIENT_TEST_LOG is set, else discards.
func coreTestLogger() *slog.Logger {
	if os.Getenv("CLIENT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}
