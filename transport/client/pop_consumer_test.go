package client

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func newPopConsumer(t *testing.T, c *Client, group, topic string, h Handler, opts ...PopOption) *PopConsumer {
	t.Helper()
	pc, err := NewPopConsumer(c, group, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Subscribe(topic, ByTag("*")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return pc
}

// TestPopConsumerConcurrent runs two pop-mode consumers of one group over
// a topic on runnel's broker: every message is consumed successfully
// exactly once between them (no rebalance, no crash: no duplicate);
// messages failed once come back with reconsume times 1 after the retry
// delay; a message that always fails is dead-lettered after max reconsume
// times and acked.
func TestPopConsumerConcurrent(t *testing.T) {
	gcl := startGroupCluster(t, 1, broker.WithPopReviveInterval(20*time.Millisecond))
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "PC", 4)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 200
	var mu sync.Mutex
	ok := map[int]int{}         // i → successful deliveries
	failed := map[int][]int32{} // i → reconsume times of failed deliveries
	h := ConcurrentHandler(func(_ context.Context, msgs []*ConsumedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			v, _ := m.Property("i")
			i, _ := strconv.Atoi(v)
			if m.Topic != "PC" {
				t.Errorf("message %d delivered as %s", i, m.Topic)
			}
			if i == 7 || (i%10 == 0 && m.ReconsumeTimes == 0) {
				failed[i] = append(failed[i], m.ReconsumeTimes)
				m.Result = ConsumeRetryLater
				continue
			}
			ok[i]++
		}
		return nil
	})
	opts := []PopOption{WithPopRetryDelays(50 * time.Millisecond), WithPopMaxReconsumeTimes(2), WithPopPollTime(time.Second),
		WithPopBatchSize(8), WithPopWorkers(4), WithPopConsumeBatchSize(2)}
	newPopConsumer(t, c, "G", "PC", h, opts...)
	newPopConsumer(t, c, "G", "PC", h, opts...)
	for i := range n {
		m := &Message{Topic: "PC", Body: []byte("x"), Queue: &qs[i%4], Properties: map[string]string{"i": strconv.Itoa(i)}}
		if _, err := p.Send(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	groupCheckFor(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(ok) < n-1 || len(failed[7]) < 3 {
			return fmt.Errorf("%d of %d consumed, message 7 failed %d times", len(ok), n-1, len(failed[7]))
		}
		return nil
	})
	var dead []protocol.MessageExt
	groupCheckFor(t, 10*time.Second, func() error {
		r, err := c.Pull(ctx, PullRequest{Queue: protocol.MessageQueue{Topic: "%DLQ%G", BrokerName: qs[0].BrokerName}, Group: "dlq"})
		if err != nil {
			return err
		}
		dead = r.Messages
		if len(dead) != 1 {
			return fmt.Errorf("%d dead letters", len(dead))
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // past a revive round: nothing more comes
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		switch {
		case i == 7:
			if ok[i] != 0 || fmt.Sprint(failed[i]) != "[0 1 2]" {
				t.Errorf("message 7: %d successes, failures at reconsume times %v; want none and [0 1 2]", ok[i], failed[i])
			}
		case ok[i] != 1:
			t.Errorf("message %d consumed %d times", i, ok[i])
		case i%10 == 0 && fmt.Sprint(failed[i]) != "[0]":
			t.Errorf("message %d: failures %v, want one", i, failed[i])
		}
	}
	if v, _ := dead[0].Property("i"); v != "7" {
		t.Errorf("dead letter is message %s, want 7", v)
	}
}

// TestPopConsumerOrderly runs an orderly pop-mode consumer: per queue the
// messages are consumed in queue order, and a batch failed once comes
// again, in order, before anything after it.
func TestPopConsumerOrderly(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "POC", 2)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const perQueue = 30
	var mu sync.Mutex
	seqs := map[int32][]int{}
	failedOnce := false
	h := OrderlyHandler(func(_ context.Context, msgs []*ConsumedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			v, _ := m.Property("seq")
			if s, _ := strconv.Atoi(v); s == 11 && m.Queue.QueueID == 1 && !failedOnce {
				failedOnce = true
				return fmt.Errorf("fail the batch of seq 11 once")
			}
		}
		for _, m := range msgs {
			v, _ := m.Property("seq")
			s, _ := strconv.Atoi(v)
			seqs[m.Queue.QueueID] = append(seqs[m.Queue.QueueID], s)
		}
		return nil
	})
	newPopConsumer(t, c, "GO", "POC", h, WithPopBatchSize(4), WithPopSuspendTime(100*time.Millisecond), WithPopPollTime(time.Second))
	for i := range perQueue {
		for _, q := range qs {
			m := &Message{Topic: "POC", Body: []byte("x"), Queue: &q, Properties: map[string]string{"seq": strconv.Itoa(i)}}
			if _, err := p.Send(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	groupCheckFor(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seqs[0]) < perQueue || len(seqs[1]) < perQueue {
			return fmt.Errorf("consumed %d and %d of %d", len(seqs[0]), len(seqs[1]), perQueue)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if !failedOnce {
		t.Error("the failing batch never came")
	}
	for q, s := range seqs {
		for i, v := range s {
			if v != i {
				t.Fatalf("queue %d consumed out of order: %v", q, s)
			}
		}
	}
}
