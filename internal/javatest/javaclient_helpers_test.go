package javatest

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Helpers of the tests that run the official Java client and mqadmin
// against runnel's broker (TestJavaClient…, TestJavaAdmin…).

// javaVersions are the pinned versions the Java-client tests run with.
var javaVersions = []string{javapeer.Version5, javapeer.Version4}

// runDriver runs one driver command to its end, bounded by d, and fails t
// on an error (with the driver's output).
func runDriver(t testing.TB, dr *javapeer.Driver, d time.Duration, namesrv, command string, args ...string) []javapeer.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	evs, err := dr.Run(ctx, namesrv, command, args...)
	if err != nil {
		t.Fatalf("driver %s %s: %v", command, strings.Join(args, " "), err)
	}
	return evs
}

// eventsOf returns the events of kind k.
func eventsOf(evs []javapeer.Event, k string) []javapeer.Event {
	var out []javapeer.Event
	for _, ev := range evs {
		if ev.Kind() == k {
			out = append(out, ev)
		}
	}
	return out
}

// decodedID is one offset message id as Java's MessageDecoder decoded it.
type decodedID struct {
	addr string
	off  int64
	err  string
}

// decodedIDs is a "sent" event's "decoded" field.
func decodedIDs(ev javapeer.Event) []decodedID {
	l, _ := ev["decoded"].([]any)
	out := make([]decodedID, 0, len(l))
	for _, x := range l {
		m, _ := x.(map[string]any)
		e := javapeer.Event(m)
		out = append(out, decodedID{addr: e.Str("addr"), off: e.Int("off"), err: e.Str("error")})
	}
	return out
}

// pullQueue reads queue q of topic from offset from to its end with
// runnel's client and returns clones of the messages.
func pullQueue(ctx context.Context, c *client.Client, q protocol.MessageQueue, from int64) ([]protocol.MessageExt, error) {
	var out []protocol.MessageExt
	off := from
	for {
		r, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 32, Group: "javatest_reader"})
		if err != nil {
			return nil, fmt.Errorf("pull %v at %d: %w", q, off, err)
		}
		switch r.Status {
		case client.PullFound:
			for i := range r.Messages {
				out = append(out, r.Messages[i].Clone())
			}
		case client.PullNoMatchedMsg:
		default:
			return out, nil
		}
		if r.NextBeginOffset <= off {
			return out, fmt.Errorf("pull %v at %d: next offset %d does not advance", q, off, r.NextBeginOffset)
		}
		off = r.NextBeginOffset
	}
}

// pullTopic reads every queue of topic from its start.
func pullTopic(ctx context.Context, c *client.Client, topic string) ([]protocol.MessageExt, error) {
	route, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []protocol.MessageExt
	for _, q := range route.SubscribeQueues() {
		ms, err := pullQueue(ctx, c, q, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, ms...)
	}
	return out, nil
}

// pullAt reads the message at offset off of queue q.
func pullAt(ctx context.Context, c *client.Client, q protocol.MessageQueue, off int64) (protocol.MessageExt, error) {
	r, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 1, Group: "javatest_reader"})
	if err != nil {
		return protocol.MessageExt{}, fmt.Errorf("pull %v at %d: %w", q, off, err)
	}
	if r.Status != client.PullFound || len(r.Messages) == 0 {
		return protocol.MessageExt{}, fmt.Errorf("pull %v at %d: %v (min %d max %d)", q, off, r.Status, r.MinOffset, r.MaxOffset)
	}
	if m := r.Messages[0]; m.QueueOffset != off {
		return protocol.MessageExt{}, fmt.Errorf("pull %v at %d returned the message at %d", q, off, m.QueueOffset)
	}
	return r.Messages[0].Clone(), nil
}

// javaI is a message's javapeer_i property (the driver's message number),
// -1 when absent.
func javaI(m *protocol.MessageExt) int {
	s, ok := m.Property("javapeer_i")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// newCluster is runnel's name server + broker for a Java-client test, with
// a client of it.
func newCluster(t *testing.T, opts ...broker.Option) (*testutil.Cluster, *client.Client) {
	t.Helper()
	cl := testutil.RunCluster(t, opts...)
	return cl, cl.NewClient(t)
}

// loopback reports whether s is "127.0.0.1:port" with a port > 0.
func loopback(s string) bool {
	ap, err := netip.ParseAddrPort(s)
	return err == nil && ap.Addr() == netip.MustParseAddr("127.0.0.1") && ap.Port() > 0
}
