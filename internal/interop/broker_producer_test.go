package interop

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// recordingConsumer starts a push consumer of group subscribed to topic
// (selector "*") that records every delivery in l under member and
// acknowledges it.
func recordingConsumer(tb testing.TB, env *brokerEnv, l *ledger, group, topic, member string, opts ...consumer.Option) rocketmq.PushConsumer {
	tb.Helper()
	c := newPushConsumer(tb, env, group, uniqueInstance(member), opts...)
	err := c.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			l.record(member, msgs...)
			return consumer.ConsumeSuccess, nil
		})
	if err != nil {
		tb.Fatalf("Subscribe: %v", err)
	}
	if err := c.Start(); err != nil {
		tb.Fatalf("consumer Start: %v", err)
	}
	return c
}

// TestBrokerProducerModes sends with every mode of the official producer
// (sync, async, oneway, batch) to a topic that does not exist yet, so the
// first send auto-creates it from TBW102, and checks with an official push
// consumer that every message arrives exactly once, as sent, at the queue
// and offset its SendResult acknowledged.
func TestBrokerProducerModes(t *testing.T) {
	t.Parallel()
	env := startBrokerEnv(t)
	topic := uniqueName("Auto")
	p := newProducer(t, env)
	l := newLedger()

	// Sync sends; the first one creates the topic through TBW102.
	for range 10 {
		m, e := l.message(topic, 512)
		res := l.sendSync(t, p, m, e)
		if res.MessageQueue.Topic != topic || res.MessageQueue.BrokerName != broker0 {
			t.Fatalf("sync send result queue %v", res.MessageQueue)
		}
	}
	env.waitRoute(t, topic, 1)
	recordingConsumer(t, env, l, uniqueName("cg"), topic, "c")

	// Async sends, all in flight at once.
	const nAsync = 50
	var wg sync.WaitGroup
	errs := make(chan error, nAsync)
	for range nAsync {
		m, e := l.message(topic, 2048)
		before := time.Now()
		wg.Add(1)
		err := p.SendAsync(context.Background(), func(_ context.Context, res *primitive.SendResult, err error) {
			defer wg.Done()
			switch {
			case err != nil:
				errs <- err
			case res.Status != primitive.SendOK:
				errs <- fmt.Errorf("status %v", res.Status)
			default:
				l.sent(e, before, time.Now(), res)
			}
		}, m)
		if err != nil {
			wg.Done()
			t.Fatalf("SendAsync: %v", err)
		}
	}
	waitGroupTimeout(t, &wg, 20*time.Second, "async send callbacks")
	close(errs)
	for err := range errs {
		t.Fatalf("async send: %v", err)
	}

	// Oneway sends: no result, so only the born-time window is known.
	for range 20 {
		m, e := l.message(topic, 256)
		before := time.Now()
		if err := p.SendOneWay(context.Background(), m); err != nil {
			t.Fatalf("SendOneWay: %v", err)
		}
		l.sent(e, before, time.Now(), nil)
	}

	// Batches: one SEND_BATCH_MESSAGE each; the result names the queue and
	// the offset of the first message, the rest follow densely.
	for range 3 {
		var msgs []*primitive.Message
		var exps []*expect
		for range 10 {
			m, e := l.message(topic, 300)
			msgs, exps = append(msgs, m), append(exps, e)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		before := time.Now()
		res, err := p.SendSync(ctx, msgs...)
		after := time.Now()
		cancel()
		if err != nil || res.Status != primitive.SendOK {
			t.Fatalf("batch SendSync: %v %v", res, err)
		}
		// The official producer reports the batch's own id, not one per
		// message, so only queue and offsets are compared.
		offIDs := strings.Split(res.OffsetMsgID, ",")
		if len(offIDs) != len(msgs) {
			t.Fatalf("batch result has %d offset ids for %d messages", len(offIDs), len(msgs))
		}
		for i, e := range exps {
			l.sent(e, before, after, nil)
			e.offID, e.queue, e.offset = offIDs[i], res.MessageQueue.QueueId, res.QueueOffset+int64(i)
		}
	}

	l.waitAll(t, 20*time.Second, "")
	l.verify(t, nil, 0)
}

// broker0 is the broker name of brokerEnv.
const broker0 = "broker-a"

// waitGroupTimeout waits for wg or fails the test after d.
func waitGroupTimeout(tb testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	tb.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		tb.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// TestBrokerOrderedSendOrderlyConsume sends interleaved sequences of 8
// sharding keys through the official hash queue selector and consumes them
// with an orderly push consumer: each key stays on one queue and arrives in
// send order, and while the consumer runs the broker holds its queue locks
// (another client asking for them gets none).
func TestBrokerOrderedSendOrderlyConsume(t *testing.T) {
	t.Parallel()
	if runOutsideRace(t) {
		return
	}
	env := startBrokerEnv(t)
	topic := uniqueName("Ordered")
	createTopic(t, env, topic, 4)
	p := newProducer(t, env, producer.WithQueueSelector(producer.NewHashQueueSelector()))
	group := uniqueName("cgOrderly")
	l := newLedger()

	var mu sync.Mutex
	seen := map[string][]int{} // shard key -> sequence numbers in delivery order
	queues := map[string]int{} // shard key -> queue
	var orderErrs []string
	c := newPushConsumer(t, env, group, uniqueInstance("orderly"), consumer.WithConsumerOrder(true))
	err := c.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			if _, ok := primitive.GetOrderlyCtx(ctx); !ok {
				return consumer.ConsumeSuccess, fmt.Errorf("no orderly context")
			}
			l.record("c", msgs...)
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				key := m.GetProperty("shard")
				n, _ := strconv.Atoi(m.GetProperty("seq"))
				seen[key] = append(seen[key], n)
				if q, ok := queues[key]; ok && q != m.Queue.QueueId {
					orderErrs = append(orderErrs, fmt.Sprintf("key %s on queues %d and %d", key, q, m.Queue.QueueId))
				}
				queues[key] = m.Queue.QueueId
			}
			return consumer.ConsumeSuccess, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}

	const keys, perKey = 8, 25
	sentQueue := map[string]int{}
	for i := range perKey {
		for k := range keys {
			key := "shard-" + strconv.Itoa(k)
			m, e := l.message(topic, 200, "shard", key, "seq", strconv.Itoa(i))
			m.WithShardingKey(key)
			res := l.sendSync(t, p, m, e)
			if q, ok := sentQueue[key]; ok && q != res.MessageQueue.QueueId {
				t.Fatalf("hash selector put key %s on queues %d and %d", key, q, res.MessageQueue.QueueId)
			}
			sentQueue[key] = res.MessageQueue.QueueId
		}
	}
	l.waitAll(t, 30*time.Second, "")
	l.verify(t, nil, 0)
	mu.Lock()
	defer mu.Unlock()
	for _, e := range orderErrs {
		t.Error(e)
	}
	for k := range keys {
		key := "shard-" + strconv.Itoa(k)
		got := seen[key]
		if len(got) != perKey {
			t.Errorf("key %s: %d deliveries, want %d", key, len(got), perKey)
			continue
		}
		for i, n := range got {
			if n != i {
				t.Errorf("key %s: delivery %d has seq %d (order %v)", key, i, n, got)
				break
			}
		}
		if queues[key] != sentQueue[key] {
			t.Errorf("key %s consumed from queue %d, sent to %d", key, queues[key], sentQueue[key])
		}
	}

	// The orderly consumer locked its queues on the broker: a second client
	// of the same group gets none of them (the locks last 60 s).
	conn := dialTB(t, env.addr)
	body := protocol.LockBatchRequestBody{ClientID: "127.0.0.1@intruder", ConsumerGroup: group}
	for q := range 4 {
		body.MQSet = append(body.MQSet, protocol.MessageQueue{Topic: topic, BrokerName: broker0, QueueID: int32(q)})
	}
	locked := lockBatch(t, conn, body)
	if len(locked) != 0 {
		t.Errorf("another client locked %v while the orderly consumer holds the queues", locked)
	}
}

// lockBatch sends LOCK_BATCH_MQ and returns the queues the broker granted.
func lockBatch(tb testing.TB, conn invoker, body protocol.LockBatchRequestBody) []protocol.MessageQueue {
	tb.Helper()
	req := protocol.NewRequest(protocol.ReqLockBatchMq)
	b, err := body.Encode()
	if err != nil {
		tb.Fatal(err)
	}
	req.Body = b
	resp := invokeTB(tb, conn, req, "LOCK_BATCH_MQ")
	if resp.Code != protocol.ResSuccess {
		tb.Fatalf("LOCK_BATCH_MQ: code %d %s", resp.Code, resp.Remark)
	}
	var out protocol.LockBatchResponseBody
	if err := out.Decode(resp.Body); err != nil {
		tb.Fatalf("LOCK_BATCH_MQ body: %v", err)
	}
	return out.LockOKMQSet
}

// TestBrokerDelayLevel sends a message with delay level 1 (1 s) next to an
// undelayed one: the undelayed one arrives at once, the delayed one not
// before a second has passed, with everything it carried intact.
func TestBrokerDelayLevel(t *testing.T) {
	t.Parallel()
	env := startBrokerEnv(t)
	topic := uniqueName("Delay")
	createTopic(t, env, topic, 2)
	p := newProducer(t, env)
	l := newLedger()
	recordingConsumer(t, env, l, uniqueName("cgDelay"), topic, "c")

	delayed, de := l.message(topic, 100)
	delayed.WithDelayTimeLevel(1)
	start := time.Now()
	l.sendSync(t, p, delayed, de)
	// The acknowledged offset and offset id are in the broker's schedule
	// topic; the message is stored again in the topic when it is due.
	de.offset, de.offID = -1, ""
	plain, pe := l.message(topic, 100)
	l.sendSync(t, p, plain, pe)

	l.waitAll(t, 10*time.Second, "")
	l.verify(t, nil, 0)
	dAt := l.deliveries(de.id)[0].at
	pAt := l.deliveries(pe.id)[0].at
	if d := dAt.Sub(start); d < time.Second {
		t.Errorf("delay level 1 message arrived after %v, before its 1 s delay", d)
	} else if d > 5*time.Second {
		t.Errorf("delay level 1 message arrived after %v", d)
	}
	if !pAt.Before(dAt) {
		t.Errorf("undelayed message arrived at %v, not before the delayed one (%v)", pAt, dAt)
	}
	// As from a Java broker: DELAY is cleared on delivery, REAL_TOPIC and
	// REAL_QID tell where the message was sent.
	got := l.deliveries(de.id)[0].msg
	if v := got.GetProperty(primitive.PropertyDelayTimeLevel); v != "" {
		t.Errorf("delivered delayed message still has DELAY=%q", v)
	}
	if v := got.GetProperty(primitive.PropertyRealTopic); v != topic {
		t.Errorf("delivered delayed message has REAL_TOPIC=%q, want %q", v, topic)
	}
}
