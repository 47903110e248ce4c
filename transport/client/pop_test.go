package client

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// popBodies returns the bodies of ms.
func popBodies(ms []PoppedMessage) []string {
	out := make([]string, len(ms))
	for i := range ms {
		out[i] = string(ms[i].Body)
	}
	slices.Sort(out)
	return out
}

// TestPopAckChangeInvisible pops from runnel's broker: the messages come
// with receipt handles; an acked one never comes back; one made visible
// again at once (ChangeInvisibleTime 0) and one left to expire come back
// through the pop retry topic with reconsume times 1 and are acked there;
// a long-polled pop is answered when a message arrives.
func TestPopAckChangeInvisible(t *testing.T) {
	gcl := startGroupCluster(t, 1, broker.WithPopReviveInterval(20*time.Millisecond))
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "PT", 2)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := p.Send(ctx, &Message{Topic: "PT", Body: []byte(strconv.Itoa(i)), Queue: &qs[i%2]}); err != nil {
			t.Fatal(err)
		}
	}
	all := protocol.MessageQueue{Topic: "PT", BrokerName: qs[0].BrokerName, QueueID: -1}
	r, err := c.Pop(ctx, PopRequest{Queue: all, Group: "G", InvisibleTime: 2 * time.Second, FromFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != PopFound || !slices.Equal(popBodies(r.Messages), []string{"0", "1", "2"}) {
		t.Fatalf("pop: %v %v", r.Status, popBodies(r.Messages))
	}
	byBody := map[string]*PoppedMessage{}
	for i := range r.Messages {
		m := &r.Messages[i]
		if m.Handle.BrokerName != qs[0].BrokerName || m.Handle.MsgQueueOffset != m.QueueOffset || m.Handle.PopTime != r.PopTime {
			t.Errorf("message %s: handle %+v", m.Body, m.Handle)
		}
		byBody[string(m.Body)] = m
	}
	if err := c.Ack(ctx, byBody["0"]); err != nil {
		t.Fatal(err)
	}
	if err := c.ChangeInvisibleTime(ctx, byBody["1"], 0); err != nil {
		t.Fatal(err)
	}
	// "1" at once, "2" once its 2 s passed: from the retry topic.
	var back []PoppedMessage
	start := time.Now()
	groupCheckFor(t, 15*time.Second, func() error {
		r, err := c.Pop(ctx, PopRequest{Queue: all, Group: "G", InvisibleTime: time.Minute, PollTime: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, r.Messages...)
		if len(back) < 2 {
			return fmt.Errorf("back so far: %v", popBodies(back))
		}
		return nil
	})
	if !slices.Equal(popBodies(back), []string{"1", "2"}) {
		t.Fatalf("revived %v, want 1 and 2", popBodies(back))
	}
	for i := range back {
		m := &back[i]
		if m.ReconsumeTimes != 1 || m.Topic != "PT" || m.Handle.Retry != protocol.PopRetryV1 {
			t.Errorf("revived %s: reconsume %d topic %s retry %q", m.Body, m.ReconsumeTimes, m.Topic, m.Handle.Retry)
		}
		if err := c.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if time.Since(start) < time.Second {
		t.Errorf("message 2 came back after %v, before its invisible time", time.Since(start))
	}
	// Nothing more: acked messages stay consumed (wait past a revive).
	time.Sleep(300 * time.Millisecond)
	if r, err := c.Pop(ctx, PopRequest{Queue: all, Group: "G"}); err != nil || r.Status != PopNoNewMsg {
		t.Fatalf("after every ack: %v %v", r, err)
	}
	// Long polling: a parked pop is answered by the next send.
	done := make(chan *PopResult, 1)
	go func() {
		r, err := c.Pop(ctx, PopRequest{Queue: all, Group: "G", PollTime: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := p.Send(ctx, &Message{Topic: "PT", Body: []byte("late"), Queue: &qs[0]}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r == nil || !slices.Equal(popBodies(r.Messages), []string{"late"}) {
			t.Fatalf("long-polled pop: %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("the parked pop was not answered")
	}
}

// TestPopOrderly pops a queue orderly: the next batch waits until the
// previous one is acked; an unacked batch comes again, in order, with its
// delivery count, once its invisible time passed.
func TestPopOrderly(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "PO", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 4 {
		if _, err := p.Send(ctx, &Message{Topic: "PO", Body: []byte(strconv.Itoa(i)), Queue: &qs[0]}); err != nil {
			t.Fatal(err)
		}
	}
	req := PopRequest{Queue: qs[0], Group: "G", MaxMsgs: 2, InvisibleTime: time.Second, Order: true, FromFirst: true}
	first, err := c.Pop(ctx, req)
	if err != nil || !slices.Equal(popBodies(first.Messages), []string{"0", "1"}) {
		t.Fatalf("first orderly pop: %v %v", first, err)
	}
	if r, err := c.Pop(ctx, req); err != nil || r.Status != PopNoNewMsg {
		t.Fatalf("pop while the batch is unacked: %+v %v", r, err)
	}
	var again *PopResult
	groupCheckFor(t, 10*time.Second, func() error {
		r, err := c.Pop(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != PopFound {
			return fmt.Errorf("status %v", r.Status)
		}
		again = r
		return nil
	})
	if got := []string{string(again.Messages[0].Body), string(again.Messages[1].Body)}; !slices.Equal(got, []string{"0", "1"}) {
		t.Fatalf("after the invisible time: %v, want 0 1 again", got)
	}
	for i := range again.Messages {
		if m := &again.Messages[i]; m.ReconsumeTimes != 1 {
			t.Errorf("redelivered %s with reconsume times %d, want 1", m.Body, m.ReconsumeTimes)
		}
		if err := c.Ack(ctx, &again.Messages[i]); err != nil {
			t.Fatal(err)
		}
	}
	next, err := c.Pop(ctx, req)
	if err != nil || len(next.Messages) != 2 || string(next.Messages[0].Body) != "2" || string(next.Messages[1].Body) != "3" {
		t.Fatalf("after the acks: %+v %v", next, err)
	}
}
