package interop

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// newLitePull returns an official lite pull consumer of group on env (not
// started), shut down at test end.
func newLitePull(tb testing.TB, env *brokerEnv, group string) rocketmq.PullConsumer {
	tb.Helper()
	c, err := rocketmq.NewPullConsumer(
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{env.nsAddr})),
		consumer.WithGroupName(group),
		consumer.WithInstance(uniqueInstance("lite")),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithAutoCommit(false),
	)
	if err != nil {
		tb.Fatalf("NewPullConsumer: %v", err)
	}
	tb.Cleanup(func() { _ = c.Shutdown() })
	return c
}

// pollInto polls c until until() holds, recording every message in l under
// member and acknowledging each request with ConsumeSuccess.
func pollInto(tb testing.TB, c rocketmq.PullConsumer, l *ledger, member string, until func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !until() {
		if time.Now().After(deadline) {
			tb.Fatalf("poll: timed out after 20 s (%d messages delivered)", l.count())
		}
		cr, err := c.Poll(context.Background(), 200*time.Millisecond)
		if errors.Is(err, consumer.ErrNoNewMsg) {
			continue
		}
		if err != nil {
			tb.Fatalf("Poll: %v", err)
		}
		l.record(member, cr.GetMsgList()...)
		c.ACK(context.Background(), cr, consumer.ConsumeSuccess)
	}
}

// TestBrokerLitePullConsumer drives the official lite pull consumer: with
// queues assigned it polls every message exactly once, as sent; after
// SeekOffset it reads a queue again from the chosen offset; subscribed (a
// second group, rebalanced by the broker's member list) it gets every
// message; its acknowledged offsets reach the broker.
func TestBrokerLitePullConsumer(t *testing.T) {
	t.Parallel()
	env := startBrokerEnv(t)
	const queues = 2
	topic := uniqueName("Lite")
	createTopic(t, env, topic, queues)
	p := newProducer(t, env, producer.WithQueueSelector(producer.NewManualQueueSelector()))
	l := newLedger()
	for i := range 20 {
		m, e := l.message(topic, 700)
		m.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: broker0, QueueId: i % queues}
		l.sendSync(t, p, m, e)
	}

	// Assign both queues.
	assigned := newLitePull(t, env, uniqueName("cgLiteA"))
	var mqs []*primitive.MessageQueue
	for q := range queues {
		mqs = append(mqs, &primitive.MessageQueue{Topic: topic, BrokerName: broker0, QueueId: q})
	}
	if err := assigned.Assign(topic, mqs); err != nil {
		t.Fatalf("Assign: %v", err)
	}
	if err := assigned.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	pollInto(t, assigned, l, "assigned", func() bool { return l.deliveredAll("assigned") })
	l.verify(t, []string{"assigned"}, 1)

	// Seek queue 0 back to offset 3; one more message wakes the parked pull
	// of that queue, whose next pull starts at the seek offset.
	assigned.SeekOffset(mqs[0], 3)
	m, e := l.message(topic, 100)
	m.Queue = mqs[0]
	l.sendSync(t, p, m, e)
	reread := func(e expect) bool { return e.queue == 0 && e.offset >= 3 && e.id != m.GetProperty(idProp) }
	pollInto(t, assigned, l, "assigned", func() bool {
		for _, e := range l.expected() {
			if reread(e) && len(l.deliveries(e.id)) < 2 {
				return false
			}
		}
		return l.deliveredAll("assigned")
	})
	for _, e := range l.expected() {
		want := 1
		if reread(e) {
			want = 2
		}
		if n := len(l.deliveries(e.id)); n != want && e.id != m.GetProperty(idProp) {
			t.Errorf("message %s at queue %d offset %d delivered %d times after the seek to 3, want %d", e.id, e.queue, e.offset, n, want)
		}
	}
	for _, e := range l.expected() {
		for _, r := range l.deliveries(e.id) {
			if err := e.compare(r.msg); err != nil {
				t.Errorf("message %s: %v", e.id, err)
			}
		}
	}

	// Subscribe with a second group: the client rebalances the topic's
	// queues onto itself and polls everything.
	group := uniqueName("cgLiteS")
	subscribed := newLitePull(t, env, group)
	if err := subscribed.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"}); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := subscribed.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	pollInto(t, subscribed, l, "subscribed", func() bool { return l.deliveredAll("subscribed") })
	l.verify(t, []string{"subscribed"}, 1)

	// Its acknowledged offsets, persisted, are what the broker holds.
	conn := dialTB(t, env.addr)
	if err := subscribed.PersistOffset(context.Background(), topic); err != nil {
		t.Fatalf("PersistOffset: %v", err)
	}
	for q := range queues {
		mq := &primitive.MessageQueue{Topic: topic, BrokerName: broker0, QueueId: q}
		cur, err := subscribed.CurrentOffset(mq)
		if err != nil {
			t.Fatalf("CurrentOffset: %v", err)
		}
		want := int64(10)
		if q == 0 {
			want = 11
		}
		if cur != want {
			t.Errorf("queue %d: current offset %d, want %d", q, cur, want)
		}
		waitUntil(t, 5*time.Second, "the committed offset on the broker", func() bool {
			return queryOffset(t, conn, group, topic, int32(q)) == want
		})
	}
}

// queryOffset asks the broker for group's committed offset of a queue (-1
// when it has none).
func queryOffset(tb testing.TB, conn interface {
	Invoke(context.Context, *protocol.Command) (*protocol.Command, error)
}, group, topic string, queue int32) int64 {
	tb.Helper()
	req := protocol.NewRequest(protocol.ReqQueryConsumerOffset)
	h := protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: topic, QueueID: queue}
	h.Encode(req)
	resp := invokeTB(tb, conn, req, "QUERY_CONSUMER_OFFSET")
	if resp.Code != protocol.ResSuccess {
		return -1
	}
	var rh protocol.QueryConsumerOffsetResponseHeader
	if err := rh.Decode(resp); err != nil {
		tb.Fatalf("QUERY_CONSUMER_OFFSET header: %v", err)
	}
	return rh.Offset
}

// TestBrokerAdminTopics creates a topic with the official admin client
// (queue counts as asked, listed by the name server, usable by a
// producer), then deletes it from broker and name server.
func TestBrokerAdminTopics(t *testing.T) {
	t.Parallel()
	env := startBrokerEnv(t)
	topic := uniqueName("Admin")
	adm := newAdmin(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(env.addr),
		admin.WithReadQueueNums(3), admin.WithWriteQueueNums(3)); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	env.waitRoute(t, topic, 3)
	list, err := adm.FetchAllTopicList(ctx)
	if err != nil {
		t.Fatalf("FetchAllTopicList: %v", err)
	}
	if !slices.Contains(list.TopicList, topic) {
		t.Errorf("topic list %v lacks %s", list.TopicList, topic)
	}
	mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
	if err != nil || len(mqs) != 3 {
		t.Fatalf("FetchPublishMessageQueues: %v %v", mqs, err)
	}

	p := newProducer(t, env)
	l := newLedger()
	m, e := l.message(topic, 100)
	res := l.sendSync(t, p, m, e)
	if res.MessageQueue.QueueId >= 3 {
		t.Errorf("send to queue %d of a 3-queue topic", res.MessageQueue.QueueId)
	}

	if err := adm.DeleteTopic(ctx, admin.WithTopicDelete(topic), admin.WithBrokerAddrDelete(env.addr),
		admin.WithNameSrvAddr([]string{env.nsAddr})); err != nil {
		t.Fatalf("DeleteTopic: %v", err)
	}
	env.waitNoRoute(t, topic)
	list, err = adm.FetchAllTopicList(ctx)
	if err != nil {
		t.Fatalf("FetchAllTopicList: %v", err)
	}
	if slices.Contains(list.TopicList, topic) {
		t.Errorf("deleted topic %s still listed", topic)
	}
	// The broker forgot its config: its max offset query fails.
	conn := dialTB(t, env.addr)
	req := protocol.NewRequest(protocol.ReqGetMaxOffset)
	h := protocol.GetMaxOffsetRequestHeader{Topic: topic, QueueID: 0}
	h.Encode(req)
	resp, err := conn.Invoke(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code == protocol.ResSuccess {
		var rh protocol.GetMaxOffsetResponseHeader
		if err := rh.Decode(resp); err == nil && rh.Offset != 0 {
			t.Errorf("deleted topic still has max offset %d", rh.Offset)
		}
	}
}
