package javatest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// feeder sends messages to runnel's broker from its own goroutine, one
// every few milliseconds, round robin over the queues, until stopped.
type feeder struct {
	stopping atomic.Bool
	done     chan struct{}
	err      error // set before done closes

	mu   sync.Mutex
	sent []fedMsg
}

// mk gives message i's tag and extra properties.
func startFeeder(t *testing.T, ctx context.Context, p *consumePeer, qs []protocol.MessageQueue, every time.Duration,
	mk func(i int) (string, map[string]string)) *feeder {
	f := &feeder{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for i := 0; !f.stopping.Load() && i < 5000; i++ {
			tag, extra := mk(i)
			s, err := p.sendOne(ctx, qs[i%len(qs)], i, tag, extra)
			if err != nil {
				f.err = fmt.Errorf("feeder: send %d: %w", i, err)
				return
			}
			f.mu.Lock()
			f.sent = append(f.sent, s)
			f.mu.Unlock()
			time.Sleep(every)
		}
	}()
	t.Cleanup(func() { f.stopping.Store(true); <-f.done })
	return f
}

// stop stops the feeder and returns what it sent.
func (f *feeder) stop(t *testing.T) []fedMsg {
	t.Helper()
	f.stopping.Store(true)
	<-f.done
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f.sent
}

// recentQueues returns the queues r delivered messages from in the last
// window (by the driver's wall clock).
func recentQueues(r *javaRun, window time.Duration) map[int32]bool {
	recvs := r.kind("recv")
	out := map[int32]bool{}
	if len(recvs) == 0 {
		return out
	}
	since := time.Now().Add(-window).UnixMilli()
	for _, ev := range slices.Backward(recvs) {
		if ev.Int("t_ms") < since {
			break
		}
		out[int32(ev.Int("q"))] = true
	}
	return out
}

// checkShared checks that the consumers' recent deliveries split the
// queues between them: every queue consumed, none by two of them.
func checkShared(n int, window time.Duration, runs ...*javaRun) error {
	owner := map[int32]string{}
	for _, r := range runs {
		qs := recentQueues(r, window)
		if len(qs) == 0 {
			return fmt.Errorf("%s received nothing in the last %v", r.name, window)
		}
		for q := range qs {
			if o, ok := owner[q]; ok {
				return fmt.Errorf("queue %d consumed by %s and %s in the last %v", q, o, r.name, window)
			}
			owner[q] = r.name
		}
	}
	if len(owner) != n {
		return fmt.Errorf("%d queues consumed in the last %v, want %d: %v", len(owner), window, n, owner)
	}
	return nil
}

// TestJavaClientPushRebalance runs the official Java client's
// DefaultMQPushConsumer (concurrently) against runnel's broker while
// messages keep coming: one consumer, a second joining (the two split the
// queues), a third joining, the first killed (-9). Every message must be
// delivered with its body, tag, keys and properties, duplicates only
// across a queue's change of owner; the clean shutdown of the last two must
// leave the group's offsets at the queues' ends on the broker, and a new
// consumer of the group must resume from there.
func TestJavaClientPushRebalance(t *testing.T) {
	for _, v := range []string{javapeer.Version5, javapeer.Version4} {
		t.Run(v, func(t *testing.T) { testJavaClientPushRebalance(t, v) })
	}
}

func testJavaClientPushRebalance(t *testing.T, version string) {
	d := javapeer.RequireVersion(t, version)
	p := startConsumePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topic, group := uniqueName(t, "T"), uniqueName(t, "G")
	qs := testutil.CreateTopic(t, p.client, p.BrokerAddr, topic, 4)
	dr := d.NewDriver(t)
	args := func(instance string, extra ...string) []string {
		return append([]string{"--topic", topic, "--group", group, "--count", "0", "--timeout-ms", "150000",
			"--instance", instance}, extra...)
	}
	tag := func(i int) string { return fmt.Sprint("t", i%3) }
	f := startFeeder(t, ctx, p, qs, 8*time.Millisecond, func(i int) (string, map[string]string) { return tag(i), nil })

	const window = time.Second
	a := startJava(t, ctx, dr, p.NameServer, "a", "push", args("a")...)
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error { return checkShared(4, window, a) })

	b := startJava(t, ctx, dr, p.NameServer, "b", "push", args("b")...)
	b.waitStarted(t)
	// The client's own rebalance period is 20 s; the broker's
	// NOTIFY_CONSUMER_IDS_CHANGED makes a rebalance happen much sooner.
	testutil.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error { return checkShared(4, window, a, b) })

	// c heartbeats every second, with heartbeat v2 where the client has it
	// (5.x): heartbeats without subscriptions while the broker says they
	// are unchanged.
	cArgs := args("c", "--heartbeat-ms", "1000")
	if version == javapeer.Version5 {
		cArgs = append(cArgs, "--heartbeat-v2", "true")
	}
	c := startJava(t, ctx, dr, p.NameServer, "c", "push", cArgs...)
	c.waitStarted(t)
	testutil.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error { return checkShared(4, window, a, b, c) })

	a.kill()
	testutil.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error { return checkShared(4, window, b, c) })

	sent := f.stop(t)
	ids := bySent(sent)
	runs := []*javaRun{a, b, c}
	testutil.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		got := map[string]bool{}
		for _, r := range runs {
			for _, ev := range r.okRecvs() {
				got[ev.Str("id")] = true
			}
		}
		for _, s := range sent {
			if !got[s.id] {
				return fmt.Errorf("message %d (%s, queue %d offset %d) not delivered yet", s.i, s.id, s.queue, s.off)
			}
		}
		return nil
	})
	stopAll(t, b, c)

	// Every delivery is one of the sent messages, intact; a message
	// delivered twice was delivered by two consumers (a queue changed
	// owner before its offset was committed), never twice by one.
	by := map[string][]string{}
	for _, r := range runs {
		seen := map[string]bool{}
		for _, ev := range r.okRecvs() {
			id := ev.Str("id")
			s, ok := ids[id]
			if !ok {
				t.Errorf("%s received a message that was not sent: %v", r.name, ev)
				continue
			}
			checkRecv(t, r.name, ev, s)
			if ev.Int("reconsume") != 0 || ev.Int("delivery") != 1 {
				t.Errorf("%s: delivery %d (reconsume %d) of %s, but nothing failed", r.name, ev.Int("delivery"), ev.Int("reconsume"), id)
			}
			if seen[id] {
				t.Errorf("%s received %s twice", r.name, id)
			}
			seen[id] = true
			by[id] = append(by[id], r.name)
		}
	}
	dups := 0
	for _, who := range by {
		if len(who) > 1 {
			dups++
		}
	}
	t.Logf("%d messages sent, %d delivered to two consumers (a, b, c received %d, %d, %d)",
		len(sent), dups, len(a.okRecvs()), len(b.okRecvs()), len(c.okRecvs()))
	if len(b.okRecvs()) == 0 || len(c.okRecvs()) == 0 {
		t.Fatal("a joining consumer received nothing")
	}

	// The clean shutdowns committed the group's offsets on the broker:
	// every queue's end.
	committed := p.brokerOffsets(t, ctx, group, qs)
	if ends := p.maxOffsets(t, ctx, qs); !mapsEqual(committed, ends) {
		t.Fatalf("committed offsets on runnel's broker %v, want the queues' ends %v", committed, ends)
	}
	if n := p.codes.count(protocol.ReqUpdateConsumerOffset); n == 0 {
		t.Errorf("no UPDATE_CONSUMER_OFFSET reached the broker")
	}

	// A new consumer of the group resumes there: it gets exactly the
	// messages sent after.
	more := p.sendN(t, ctx, qs, len(sent), 12, tag)
	dn := startJava(t, ctx, dr, p.NameServer, "d", "push", "--topic", topic, "--group", group, "--count", "12",
		"--timeout-ms", "60000", "--instance", "d")
	dn.wait(t)
	newIDs := bySent(more)
	for _, ev := range dn.okRecvs() {
		s, ok := newIDs[ev.Str("id")]
		if !ok {
			t.Errorf("restarted consumer received %v: not one of the messages sent after the committed offsets", ev)
			continue
		}
		checkRecv(t, "d", ev, s)
		delete(newIDs, s.id)
	}
	if len(newIDs) != 0 {
		t.Errorf("restarted consumer did not receive %d messages", len(newIDs))
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
