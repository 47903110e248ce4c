package testutil

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeTB records Fatalf instead of stopping the test, so CheckFor's
// failure path can be observed.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestCheckForSucceedsOnceFnDoes(t *testing.T) {
	calls := 0
	CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("fn called %d times, want 3", calls)
	}
}

func TestCheckForFailsWithLastError(t *testing.T) {
	f := &fakeTB{TB: t}
	calls := 0
	start := time.Now()
	CheckFor(f, 50*time.Millisecond, 5*time.Millisecond, func() error {
		calls++
		if calls == 1 {
			return errors.New("first")
		}
		return errors.New("last")
	})
	if f.failed == "" {
		t.Fatal("CheckFor did not fail")
	}
	if !strings.Contains(f.failed, "last") || strings.Contains(f.failed, "first") {
		t.Fatalf("failure %q does not report only the last error", f.failed)
	}
	if calls < 2 {
		t.Fatalf("fn called %d times, want several", calls)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before total", d)
	}
}

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
