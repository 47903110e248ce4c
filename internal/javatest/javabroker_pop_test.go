package javatest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaBrokerPop runs runnel's POP primitives against Apache RocketMQ
// 5.3.3's broker (4.9 has no POP): a pop of every queue returns the
// messages with receipt handles the Java broker accepts; an acked message
// does not come back; one made visible again at once
// (CHANGE_MESSAGE_INVISIBLETIME 0) comes back through the Java broker's
// revive, from %RETRY%<group>_<topic> with reconsume times 1, and is acked
// there; then an orderly pop blocks the queue until its batch is acked.
func TestJavaBrokerPop(t *testing.T) {
	_, c := javaCluster(t, javapeer.Version5)
	awaitRegistered(t, c)
	ctx := bg(t, 2*time.Minute)
	cl := newJavaClient(t, c)
	topic, group := uniqueName(t, "pop"), uniqueName(t, "g")
	qs := createJavaTopic(t, cl, c, topic, 2)
	p := newJavaProducer(t, cl, uniqueName(t, "pg"))
	for i := range 3 {
		if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte(strconv.Itoa(i)), Queue: &qs[i%2]}); err != nil {
			t.Fatal(err)
		}
	}
	all := protocol.MessageQueue{Topic: topic, BrokerName: qs[0].BrokerName, QueueID: -1}
	var got []client.PoppedMessage
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		r, err := cl.Pop(ctx, client.PopRequest{Queue: all, Group: group, InvisibleTime: time.Minute, FromFirst: true,
			PollTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Messages...)
		if len(got) < 3 {
			return fmt.Errorf("popped %d of 3", len(got))
		}
		return nil
	})
	byBody := map[string]*client.PoppedMessage{}
	for i := range got {
		byBody[string(got[i].Body)] = &got[i]
	}
	if len(byBody) != 3 {
		t.Fatalf("popped %d distinct messages of 3", len(byBody))
	}
	for _, b := range []string{"0", "2"} {
		if err := cl.Ack(ctx, byBody[b]); err != nil {
			t.Fatalf("ack %s: %v", b, err)
		}
	}
	if err := cl.ChangeInvisibleTime(ctx, byBody["1"], 0); err != nil {
		t.Fatal(err)
	}
	var back []client.PoppedMessage
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		r, err := cl.Pop(ctx, client.PopRequest{Queue: all, Group: group, InvisibleTime: time.Minute, PollTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, r.Messages...)
		if len(back) == 0 {
			return fmt.Errorf("nothing came back yet")
		}
		return nil
	})
	if len(back) != 1 || string(back[0].Body) != "1" || back[0].ReconsumeTimes != 1 || back[0].Topic != topic ||
		back[0].Handle.Retry != protocol.PopRetryV1 {
		t.Fatalf("came back: %d messages, first %q reconsume %d topic %s handle %+v", len(back), back[0].Body,
			back[0].ReconsumeTimes, back[0].Topic, back[0].Handle)
	}
	if err := cl.Ack(ctx, &back[0]); err != nil {
		t.Fatal(err)
	}

	// Orderly: the queue's next batch only after the acks.
	oq := qs[0]
	for i := range 3 {
		if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte("o" + strconv.Itoa(i)), Queue: &oq}); err != nil {
			t.Fatal(err)
		}
	}
	og := uniqueName(t, "og")
	req := client.PopRequest{Queue: oq, Group: og, MaxMsgs: 2, InvisibleTime: time.Minute, Order: true, FromFirst: true, PollTime: time.Second}
	var first *client.PopResult
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		r, err := cl.Pop(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) == 0 {
			return fmt.Errorf("orderly pop found nothing")
		}
		first = r
		return nil
	})
	bodies := func(ms []client.PoppedMessage) []string {
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Body))
		}
		return out
	}
	// The queue holds "0" (or "2") first, then o0, o1: the batch is in
	// queue order.
	fb := bodies(first.Messages)
	if !slices.IsSortedFunc(first.Messages, func(a, b client.PoppedMessage) int { return int(a.QueueOffset - b.QueueOffset) }) {
		t.Fatalf("orderly batch out of order: %v", fb)
	}
	blocked, err := cl.Pop(ctx, client.PopRequest{Queue: oq, Group: og, MaxMsgs: 2, InvisibleTime: time.Minute, Order: true})
	if err != nil || len(blocked.Messages) != 0 {
		t.Fatalf("orderly pop while the batch %v is unacked: %v %v", fb, bodies(blocked.Messages), err)
	}
	for i := range first.Messages {
		if err := cl.Ack(ctx, &first.Messages[i]); err != nil {
			t.Fatal(err)
		}
	}
	next, err := cl.Pop(ctx, req)
	if err != nil || len(next.Messages) == 0 || next.Messages[0].QueueOffset != first.Messages[len(first.Messages)-1].QueueOffset+1 {
		t.Fatalf("orderly pop after the acks: %v %v (first batch %v)", next, err, fb)
	}
}

// TestJavaBrokerPopConsumer runs runnel's PopConsumer against Apache
// RocketMQ 5.3.3's broker: every message consumed once, and one failed
// once back (CHANGE_MESSAGE_INVISIBLETIME, revived by the Java broker
// through its pop retry topic) with reconsume times 1.
func TestJavaBrokerPopConsumer(t *testing.T) {
	_, c := javaCluster(t, javapeer.Version5)
	awaitRegistered(t, c)
	ctx := bg(t, 2*time.Minute)
	cl := newJavaClient(t, c)
	topic, group := uniqueName(t, "popc"), uniqueName(t, "g")
	qs := createJavaTopic(t, cl, c, topic, 2)
	p := newJavaProducer(t, cl, uniqueName(t, "pg"))
	const n = 20
	var mu sync.Mutex
	ok := map[int]int{}
	var failedAt []int32
	h := client.ConcurrentHandler(func(_ context.Context, msgs []*client.ConsumedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			i, _ := strconv.Atoi(string(m.Body))
			if i == 3 && m.ReconsumeTimes == 0 {
				failedAt = append(failedAt, m.ReconsumeTimes)
				m.Result = client.ConsumeRetryLater
				continue
			}
			if i == 3 && m.ReconsumeTimes != 1 {
				t.Errorf("message 3 came back with reconsume times %d", m.ReconsumeTimes)
			}
			ok[i]++
		}
		return nil
	})
	pc, err := client.NewPopConsumer(cl, group, h, client.WithPopFromFirst(), client.WithPopRetryDelays(time.Second),
		client.WithPopPollTime(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := pc.Subscribe(topic, client.ByTag("*")); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte(strconv.Itoa(i)), Queue: &qs[i%2]}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(ok) < n {
			return fmt.Errorf("consumed %d of %d", len(ok), n)
		}
		return nil
	})
	if err := pc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if ok[i] != 1 {
			t.Errorf("message %d consumed %d times", i, ok[i])
		}
	}
	if len(failedAt) != 1 {
		t.Errorf("message 3 failed %d times, want once", len(failedAt))
	}
}
