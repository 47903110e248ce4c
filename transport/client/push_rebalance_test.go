package client

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// membership is a time-stamped membership change of a test.
type membership struct {
	at   time.Time
	what string
}

// produceInBackground sends messages i = 0, 1, … with sharding key
// i%keys and property seq (the message's number within its key) until stop
// is closed or n are sent; it returns the count sent.
func produceInBackground(t *testing.T, p *Producer, topic string, n, keys int, stop <-chan struct{}) func() int {
	var sent atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := range n {
			select {
			case <-stop:
				return
			default:
			}
			k := i % keys
			m := &Message{Topic: topic, Body: []byte("x"), ShardingKey: "k" + strconv.Itoa(k),
				Properties: map[string]string{"i": strconv.Itoa(i), "seq": strconv.Itoa(i / keys), "key": strconv.Itoa(k)}}
			if _, err := p.Send(ctx, m); err != nil {
				t.Errorf("send %d: %v", i, err)
				return
			}
			sent.Add(1)
			if i%50 == 49 {
				time.Sleep(5 * time.Millisecond) // a steady stream, not one burst
			}
		}
	}()
	return func() int { <-done; return int(sent.Load()) }
}

// TestPushRebalanceAtLeastOnce consumes a stream with members joining,
// leaving gracefully and crashing: every message is consumed, and a
// message is consumed twice only around a membership change (RocketMQ's
// at-least-once). The duplicates are counted, logged and bounded.
func TestPushRebalanceAtLeastOnce(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	admin := gcl.client(t)
	gcl.createTopic(t, admin, "RB", 8)
	p, err := NewProducer(admin, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	var (
		evMu   sync.Mutex
		events []membership
	)
	event := func(what string) {
		evMu.Lock()
		events = append(events, membership{time.Now(), what})
		evMu.Unlock()
	}
	member := func(name string) (*Client, *PushConsumer) {
		c := gcl.client(t)
		pc := newPushConsumer(t, c, "GRB", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
			for _, m := range msgs {
				rec.add(name, m)
			}
			time.Sleep(time.Millisecond) // some work
			return nil
		}), WithConsumeFrom(ConsumeFromFirst), WithPersistInterval(100*time.Millisecond), WithConsumeWorkers(4))
		startPush(t, pc, "RB", ByTag("*"))
		event(name + " joined")
		return c, pc
	}
	const n = 1500
	stop := make(chan struct{})
	wait := produceInBackground(t, p, "RB", n, 8, stop)
	progress := func(want int) {
		groupCheckFor(t, 30*time.Second, func() error {
			if got := rec.distinct(); got < want {
				return fmt.Errorf("%d of %d consumed", got, want)
			}
			return nil
		})
	}
	_, a := member("a")
	progress(n / 5)
	cb, _ := member("b")
	progress(2 * n / 5)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	event("a leaving")
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	event("a left")
	_, _ = member("c")
	progress(3 * n / 5)
	event("b crashing")
	_ = cb.Close() // no Shutdown: no final offset commit, no unregistration
	event("b crashed")
	sent := wait()
	close(stop)
	progress(sent)

	ds := rec.snapshot()
	dups := 0
	byID := map[string][]delivery{}
	for _, d := range ds {
		byID[d.id] = append(byID[d.id], d)
	}
	near := func(at time.Time) bool {
		evMu.Lock()
		defer evMu.Unlock()
		for _, e := range events {
			if d := at.Sub(e.at); d > -5*time.Second && d < 5*time.Second {
				return true
			}
		}
		return false
	}
	for id, list := range byID {
		if len(list) == 1 {
			continue
		}
		dups += len(list) - 1
		if !near(list[0].at) {
			t.Errorf("message %s consumed %d times, first at %s, far from any membership change", id, len(list), list[0].at.Format("15:04:05.000"))
		}
	}
	var evs []string
	for _, e := range events {
		evs = append(evs, e.at.Format("15:04:05.000")+" "+e.what)
	}
	t.Logf("%d messages, %d deliveries, %d duplicates; membership changes %v", sent, len(ds), dups, evs)
	if len(byID) != sent {
		t.Errorf("%d distinct messages consumed, %d sent", len(byID), sent)
	}
	if dups > sent/3 {
		t.Errorf("%d duplicates of %d messages", dups, sent)
	}
}

// callRecord is one orderly handler call.
type callRecord struct {
	member     string
	q          protocol.MessageQueue
	seqs       []int
	start, end time.Time
}

// TestPushOrderlyRebalance runs orderly members over a keyed stream while
// a member joins and another is killed (its client closed: no unlock, no
// offset commit): per queue, no two members ever consume at once (the
// broker locks fence them), each member sees a queue's keys in order, and
// the next owner of a killed member's queue goes on from its committed
// offset (some messages again, none skipped).
func TestPushOrderlyRebalance(t *testing.T) {
	gcl := startGroupCluster(t, 1, broker.WithLockExpiry(3*time.Second))
	admin := gcl.client(t)
	gcl.createTopic(t, admin, "OR", 4)
	p, err := NewProducer(admin, "pg", WithSelector(HashBySharding()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var (
		mu    sync.Mutex
		calls []callRecord
	)
	seen := newRecorder()
	member := func(name string) (*Client, *PushConsumer) {
		c := gcl.client(t)
		pc := newPushConsumer(t, c, "GOR", OrderlyHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
			cr := callRecord{member: name, q: msgs[0].Queue, start: time.Now()}
			for _, m := range msgs {
				s, _ := m.Property("seq")
				k, _ := m.Property("key")
				seq, _ := strconv.Atoi(s)
				key, _ := strconv.Atoi(k)
				cr.seqs = append(cr.seqs, seq*8+key) // unique per key; order by seq within a key
				seen.add(name, m)
			}
			time.Sleep(time.Millisecond)
			cr.end = time.Now()
			mu.Lock()
			calls = append(calls, cr)
			mu.Unlock()
			return nil
		}), WithConsumeFrom(ConsumeFromFirst), WithConsumeBatchSize(4), WithPersistInterval(100*time.Millisecond),
			WithLockRenewInterval(500*time.Millisecond), WithLockValidity(1500*time.Millisecond))
		startPush(t, pc, "OR", ByTag("*"))
		return c, pc
	}
	const n = 800
	stop := make(chan struct{})
	wait := produceInBackground(t, p, "OR", n, 8, stop)
	progress := func(want int) {
		groupCheckFor(t, 45*time.Second, func() error {
			if got := seen.distinct(); got < want {
				return fmt.Errorf("%d of %d consumed", got, want)
			}
			return nil
		})
	}
	ca, _ := member("a")
	progress(n / 4)
	member("b")
	progress(n / 2)
	_ = ca.Close() // killed
	sent := wait()
	close(stop)
	progress(sent)

	mu.Lock()
	defer mu.Unlock()
	// No overlap between members on one queue.
	byQ := map[protocol.MessageQueue][]callRecord{}
	for _, c := range calls {
		byQ[c.q] = append(byQ[c.q], c)
	}
	for q, cs := range byQ {
		slices.SortFunc(cs, func(a, b callRecord) int { return a.start.Compare(b.start) })
		for i := 1; i < len(cs); i++ {
			if cs[i].member != cs[i-1].member && cs[i].start.Before(cs[i-1].end) {
				t.Errorf("%s: %s started at %s while %s was consuming (until %s)", q, cs[i].member,
					cs[i].start.Format("15:04:05.000"), cs[i-1].member, cs[i-1].end.Format("15:04:05.000"))
			}
		}
		// Per key: in order within a member's run; a new owner may go
		// back (redelivery after the kill), never skip.
		last := map[int]int{} // key → last seq
		prevMember := ""
		for _, c := range cs {
			for _, v := range c.seqs {
				key, seq := v%8, v/8
				l, ok := last[key]
				switch {
				case !ok:
					if seq != 0 && prevMember == "" {
						t.Errorf("%s key %d: first message seen has seq %d", q, key, seq)
					}
				case seq == l+1:
				case c.member != prevMember && seq <= l:
				default:
					t.Errorf("%s key %d: seq %d after %d (%s after %s)", q, key, seq, l, c.member, prevMember)
				}
				last[key] = seq
			}
			prevMember = c.member
		}
	}
	seen.mu.Lock()
	redelivered := 0
	for _, n := range seen.count {
		redelivered += n - 1
	}
	t.Logf("%d messages, %d consumed again after the kill", sent, redelivered)
	if len(seen.count) != sent {
		t.Errorf("%d distinct messages consumed, %d sent", len(seen.count), sent)
	}
	seen.mu.Unlock()
}
