package watermill_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
	rwm "github.com/runnel-dev/runnel/transport/watermill"
)

func TestMarshalRoundTrip(t *testing.T) {
	m := rwm.DefaultMarshaler{Tag: func(string, *message.Message) string { return "tag-a" }}
	msg := message.NewMessage("uuid-1", nil)
	msg.Metadata.Set("k", "v")
	msg.Metadata.Set("empty", "")
	msg.Metadata.Set("other empty", "")
	rm, err := m.Marshal("t", msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rm.Body) != 1 || rm.Tags != "tag-a" || len(rm.Keys) != 1 || rm.Keys[0] != "uuid-1" {
		t.Fatalf("marshaled %+v", rm)
	}
	if err := client.ValidateMessage(rm, 1<<20); err != nil {
		t.Fatalf("marshaled message refused by the client: %v", err)
	}
	// As a broker stores it: the properties string.
	ext := protocol.MessageExt{Topic: "t", Body: rm.Body, Properties: string(protocol.AppendProperties(nil, rm.Properties)) +
		string(protocol.AppendProperty(nil, protocol.PropUniqKey, "ignored"))}
	got, err := m.Unmarshal(&ext)
	if err != nil {
		t.Fatal(err)
	}
	if got.UUID != "uuid-1" || len(got.Payload) != 0 || len(got.Metadata) != 3 || got.Metadata["k"] != "v" {
		t.Fatalf("unmarshaled %q %q %v", got.UUID, got.Payload, got.Metadata)
	}
	if v, ok := got.Metadata["other empty"]; !ok || v != "" {
		t.Fatalf("empty metadata value lost: %v", got.Metadata)
	}

	for _, bad := range []map[string]string{{"TAGS": "x"}, {"__RMQ.TRANSIENT.x": "y"}, {rwm.UUIDProperty: "x"},
		{"": "x"}, {"a\x01": "x"}, {"a": "x\x02"}, {"a\x00b": ""}} {
		msg := message.NewMessage("u", []byte("p"))
		msg.Metadata = bad
		if _, err := m.Marshal("t", msg); !errors.Is(err, rwm.ErrInvalidMetadata) {
			t.Errorf("metadata %q: err %v, want ErrInvalidMetadata", bad, err)
		}
	}

	// A message of another producer: UNIQ_KEY becomes the UUID, system
	// properties are not metadata.
	ext = protocol.MessageExt{Body: []byte("b"), Properties: string(protocol.AppendProperties(nil,
		map[string]string{protocol.PropUniqKey: "U1", protocol.PropKeys: "k", "user": "x"}))}
	got, _ = m.Unmarshal(&ext)
	if got.UUID != "U1" || string(got.Payload) != "b" || len(got.Metadata) != 1 || got.Metadata["user"] != "x" {
		t.Fatalf("foreign message: %q %q %v", got.UUID, got.Payload, got.Metadata)
	}
}

func TestConfigValidation(t *testing.T) {
	for i, cfg := range []rwm.SubscriberConfig{
		{},
		{NameServers: []string{"x:1"}, Client: &client.Client{}},
		{NameServers: []string{"x:1"}, ConsumerGroup: "g", GenerateConsumerGroup: rwm.DefaultConsumerGroup},
		{NameServers: []string{"x:1"}, PullBatchSize: 5000},
		{NameServers: []string{"x:1"}, NackResendDelay: time.Second, NackResendMaxDelay: time.Millisecond},
		{NameServers: []string{"x:1"}, InitialOffset: 7},
	} {
		if _, err := rwm.NewSubscriber(cfg, nil); !errors.Is(err, rwm.ErrInvalidConfig) {
			t.Errorf("subscriber config %d: err %v", i, err)
		}
	}
	if _, err := rwm.NewPublisher(rwm.PublisherConfig{}, nil); !errors.Is(err, rwm.ErrInvalidConfig) {
		t.Errorf("publisher without client: err %v", err)
	}
}

func publishN(t *testing.T, pub message.Publisher, topic string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		msg := message.NewMessage(strconv.Itoa(i), []byte(strconv.Itoa(i)))
		msg.Metadata.Set("key", strconv.Itoa(i%3))
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
}

func recv(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case msg, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return msg
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15 s")
	}
	return nil
}

// TestCommitLowWatermark: acked offsets are committed on close, an unacked
// message in flight is delivered again to the next member, nothing acked is.
func TestCommitLowWatermark(t *testing.T) {
	e := newEnv(t)
	pc := pubSubConfig{queues: 1}
	pub := newPublisher(t, e.nsAddr, pc)
	sub := newSubscriber(t, e.nsAddr, pc)
	const topic = "commit-topic"
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	publishN(t, pub, topic, 0, 10)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		msg := recv(t, ch)
		if msg.UUID != strconv.Itoa(i) {
			t.Fatalf("message %d: got %s", i, msg.UUID)
		}
		q, off, ok := rwm.MessageQueueFromCtx(msg.Context())
		if !ok || q.Topic != topic || off != int64(i) {
			t.Fatalf("queue from ctx: %v %d %v", q, off, ok)
		}
		msg.Ack()
		if msg.Context().Err() == nil {
			// The context ends once the worker saw the ack; poll.
			deadline := time.Now().Add(5 * time.Second)
			for msg.Context().Err() == nil && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if msg.Context().Err() == nil {
				t.Fatal("message context not cancelled after Ack")
			}
		}
	}
	inflight := recv(t, ch) // offset 5, never acked
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed by Close")
	}
	if inflight.Context().Err() == nil {
		t.Fatal("in-flight message context not cancelled by Close")
	}
	c, err := client.New(append(clientOptions(), client.WithNameServers(e.nsAddr))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Route(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	off, err := c.QueryConsumerOffset(context.Background(), rwm.DefaultConsumerGroup(topic), r.SubscribeQueues()[0])
	if err != nil || off != 5 {
		t.Fatalf("committed offset %d, %v; want 5", off, err)
	}

	sub2 := newSubscriber(t, e.nsAddr, pc)
	ch2, err := sub2.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for i := 5; i < 10; i++ {
		msg := recv(t, ch2)
		if msg.UUID != strconv.Itoa(i) {
			t.Fatalf("after restart, message %d: got %s", i, msg.UUID)
		}
		msg.Ack()
	}
	if err := sub2.Close(); err != nil || sub2.Close() != nil {
		t.Fatalf("Close twice: %v", err)
	}
}

// TestNackThenSendBack: a nacked message is redelivered in-process, and after
// SendBackAfterAttempts nacks it comes back through the retry topic.
func TestNackThenSendBack(t *testing.T) {
	e := newEnv(t, broker.WithDelayLevels([]time.Duration{50 * time.Millisecond, 100 * time.Millisecond}))
	pc := pubSubConfig{queues: 1, mutate: func(c *rwm.SubscriberConfig) {
		c.SendBackAfterAttempts = 2
		c.SendBackDelayLevel = 1
	}}
	pub := newPublisher(t, e.nsAddr, pc)
	sub := newSubscriber(t, e.nsAddr, pc)
	const topic = "sendback-topic"
	ch, err := sub.Subscribe(context.Background(), topic) // creates the topic and the retry topic
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, pub, topic, 0, 2)
	first := recv(t, ch)
	first.Nack()
	again := recv(t, ch)
	if again.UUID != first.UUID || again.Metadata.Get("key") != first.Metadata.Get("key") {
		t.Fatalf("after one nack got %s, want %s again", again.UUID, first.UUID)
	}
	again.Nack() // second nack: sent back, the queue moves on
	next := recv(t, ch)
	next.Ack()
	back := recv(t, ch)
	q, _, _ := rwm.MessageQueueFromCtx(back.Context())
	if back.UUID != first.UUID || string(back.Payload) != string(first.Payload) || q.Topic != "%RETRY%"+rwm.DefaultConsumerGroup(topic) {
		t.Fatalf("sent back: got %s from %v (want %s and %v, then %s)", back.UUID, q, first.UUID, "%RETRY%", next.UUID)
	}
	back.Ack()
}

// TestNackSendBackDLQ: a nack goes back through CONSUMER_SEND_MSG_BACK,
// so the broker counts the redeliveries: with max reconsume times 1 the
// message comes back once from the retry topic and, nacked again, lands
// in %DLQ%<group> with its payload, and is not delivered again. (The first
// Subscriber re-published nacked messages to %RETRY% itself: their
// reconsume count stayed 0 and they never reached the dead-letter topic.)
func TestNackSendBackDLQ(t *testing.T) {
	e := newEnv(t, broker.WithDelayLevels([]time.Duration{50 * time.Millisecond, 100 * time.Millisecond}))
	pc := pubSubConfig{queues: 1, mutate: func(c *rwm.SubscriberConfig) {
		c.SendBackAfterAttempts = 1
		c.SendBackDelayLevel = 1
		c.GroupOptions = append(c.GroupOptions, client.WithMaxReconsumeTimes(1))
	}}
	pub := newPublisher(t, e.nsAddr, pc)
	sub := newSubscriber(t, e.nsAddr, pc)
	const topic = "dlq-topic"
	group := rwm.DefaultConsumerGroup(topic)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, pub, topic, 0, 1)
	first := recv(t, ch)
	first.Nack()
	back := recv(t, ch)
	q, _, _ := rwm.MessageQueueFromCtx(back.Context())
	if back.UUID != first.UUID || q.Topic != "%RETRY%"+group {
		t.Fatalf("after the nack: %s from %v, want %s from the retry topic", back.UUID, q, first.UUID)
	}
	back.Nack() // reconsumed once: the broker dead-letters it
	select {
	case m := <-ch:
		t.Fatalf("message %s delivered again after max reconsume times", m.UUID)
	case <-time.After(time.Second):
	}
	c, err := client.New(append(clientOptions(), client.WithNameServers(e.nsAddr))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var dead []protocol.MessageExt
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		r, err := c.Pull(ctx, client.PullRequest{Queue: protocol.MessageQueue{Topic: "%DLQ%" + group, BrokerName: "broker-a"},
			Group: "dlq_reader"})
		if err != nil {
			return err
		}
		if dead = r.Messages; len(dead) != 1 {
			return fmt.Errorf("%d messages in the dead-letter topic", len(dead))
		}
		return nil
	})
	// The broker counts the dead-lettering send-back too (Java's
	// consumerSendMsgBack sets reconsume times + 1 on either copy).
	if string(dead[0].Body) != string(first.Payload) || dead[0].ReconsumeTimes != 2 {
		t.Errorf("dead letter %q with reconsume times %d, want %q and 2", dead[0].Body, dead[0].ReconsumeTimes, first.Payload)
	}
}

// TestShardingKeyOrder: with a sharding key from metadata, messages of one
// key are received in publish order on a multi-queue topic.
func TestShardingKeyOrder(t *testing.T) {
	e := newEnv(t)
	pub, err := rwm.NewPublisher(rwm.PublisherConfig{NameServers: []string{e.nsAddr}, ClientOptions: clientOptions(),
		ShardingKey: rwm.ShardingKeyFromMetadata("key")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	sub := newSubscriber(t, e.nsAddr, pubSubConfig{queues: 4})
	const topic = "sharded-topic"
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	const n = 60
	publishN(t, pub, topic, 0, n)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	queues := map[string]string{}
	for range n {
		msg := recv(t, ch)
		i, _ := strconv.Atoi(msg.UUID)
		k := msg.Metadata.Get("key")
		q, _, _ := rwm.MessageQueueFromCtx(msg.Context())
		if prev, ok := last[k]; ok && prev >= i {
			t.Fatalf("key %s: message %d after %d", k, i, prev)
		}
		if qs, ok := queues[k]; ok && qs != q.String() {
			t.Fatalf("key %s on queues %s and %s", k, qs, q)
		}
		last[k], queues[k] = i, q.String()
		msg.Ack()
	}
}

// TestOffsetLastAndGroupActive: a new group with OffsetLast skips what was
// stored before; a second subscription of one group on one Subscriber is
// refused.
func TestOffsetLastAndGroupActive(t *testing.T) {
	e := newEnv(t)
	pc := pubSubConfig{queues: 1, group: "last-group", mutate: func(c *rwm.SubscriberConfig) { c.InitialOffset = rwm.OffsetLast }}
	pub := newPublisher(t, e.nsAddr, pc)
	sub := newSubscriber(t, e.nsAddr, pc)
	const topic = "last-topic"
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	publishN(t, pub, topic, 0, 3)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Subscribe(context.Background(), topic); !errors.Is(err, rwm.ErrGroupActive) {
		t.Fatalf("second subscription: %v, want ErrGroupActive", err)
	}
	publishN(t, pub, topic, 3, 1)
	if msg := recv(t, ch); msg.UUID != "3" {
		t.Fatalf("OffsetLast: got %s first, want 3", msg.UUID)
	} else {
		msg.Ack()
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Subscribe(context.Background(), topic); !errors.Is(err, rwm.ErrSubscriberClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, message.NewMessage("x", nil)); !errors.Is(err, rwm.ErrPublisherClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
}

// TestResubscribeAfterClose subscribes again in the same group as soon as
// the previous subscription's channel is closed, as watermill's
// TestSubscribeCtx does: the group must be free by then (the channel was
// closed before the group was released, and a quick resubscription got
// ErrGroupActive now and then).
func TestResubscribeAfterClose(t *testing.T) {
	e := newEnv(t)
	pc := pubSubConfig{queues: 1, group: "resub-group"}
	sub := newSubscriber(t, e.nsAddr, pc)
	const topic = "resub-topic"
	if err := sub.SubscribeInitialize(topic); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			cancel()
			t.Fatalf("subscription %d: %v", i, err)
		}
		cancel()
		for range ch { // closed once the group was left
		}
	}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Subscribe(context.Background(), topic); !errors.Is(err, rwm.ErrGroupActive) {
		t.Fatalf("second active subscription: %v, want ErrGroupActive", err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	for range ch {
	}
}
