package client

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// shortDelays makes every delay level 100 ms, so that sent-back messages
// come back at once.
func shortDelays() broker.Option {
	levels := make([]time.Duration, 18)
	for i := range levels {
		levels[i] = 100 * time.Millisecond
	}
	return broker.WithDelayLevels(levels)
}

// delivery is one handler sighting of a message.
type delivery struct {
	id        string // the "i" property
	topic     string
	queue     protocol.MessageQueue
	offset    int64
	reconsume int32
	member    string
	at        time.Time
}

// recorder collects deliveries and decides failures.
type recorder struct {
	mu    sync.Mutex
	all   []delivery
	count map[string]int // deliveries by id
}

func newRecorder() *recorder { return &recorder{count: map[string]int{}} }

func (r *recorder) add(member string, m *ConsumedMessage) int {
	id, _ := m.Property("i")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, delivery{id: id, topic: m.Topic, queue: m.Queue, offset: m.QueueOffset,
		reconsume: m.ReconsumeTimes, member: member, at: time.Now()})
	r.count[id]++
	return r.count[id]
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.count)
}

func (r *recorder) snapshot() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// sendN sends n messages with property i = from..from+n-1 (and any extra
// properties from props(i)) round robin.
func sendN(t *testing.T, p *Producer, topic string, from, n int, props func(i int) map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := from; i < from+n; i++ {
		m := &Message{Topic: topic, Body: []byte("m" + strconv.Itoa(i)), Properties: map[string]string{"i": strconv.Itoa(i)}}
		if props != nil {
			for k, v := range props(i) {
				m.Properties[k] = v
			}
		}
		if _, err := p.Send(ctx, m); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
}

func newPushConsumer(t *testing.T, c *Client, group string, h Handler, opts ...GroupOption) *PushConsumer {
	t.Helper()
	pc, err := NewPushConsumer(c, group, h, append([]GroupOption{WithRebalanceInterval(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc
}

func startPush(t *testing.T, pc *PushConsumer, topic string, sel Selector) {
	t.Helper()
	if err := pc.Subscribe(topic, sel); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPushConcurrent consumes 200 messages of 4 queues with a concurrent
// handler in batches: each once, none failed; after Shutdown the group's
// committed offsets are the queues' ends, so a new consumer of the group
// gets nothing of them again.
func TestPushConcurrent(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "PC", 4)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sendN(t, p, "PC", 0, 200, nil)
	rec := newRecorder()
	var maxBatch atomic.Int32
	pc := newPushConsumer(t, c, "G", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		if n := int32(len(msgs)); n > maxBatch.Load() {
			maxBatch.Store(n)
		}
		for _, m := range msgs {
			if m.Queue.Topic != "PC" || len(m.Body) == 0 {
				t.Errorf("message %+v", m.MessageExt)
			}
			rec.add("a", m)
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), WithConsumeBatchSize(5), WithConsumeWorkers(4))
	startPush(t, pc, "PC", ByTag("*"))
	groupCheckFor(t, 20*time.Second, func() error {
		if n := rec.distinct(); n < 200 {
			return fmt.Errorf("%d of 200 consumed", n)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for id, n := range rec.count {
		if n != 1 {
			t.Errorf("message %s consumed %d times", id, n)
		}
	}
	if maxBatch.Load() < 2 || maxBatch.Load() > 5 {
		t.Errorf("largest batch %d, want 2..5", maxBatch.Load())
	}
	for _, q := range qs {
		off, err := c.QueryConsumerOffset(ctx, "G", q)
		if err != nil {
			t.Fatal(err)
		}
		max, err := c.MaxOffset(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if off != max {
			t.Errorf("%s: committed %d, end %d", q, off, max)
		}
	}
}

// TestPushRetry fails messages and checks RocketMQ's retry path through
// the broker: a message failed twice comes back twice through %RETRY%G
// (reconsume times 1 and 2, its original topic shown, delays by the
// broker's levels), then is consumed; a message that always fails is
// dead-lettered after WithMaxReconsumeTimes(3), with four deliveries.
func TestPushRetry(t *testing.T) {
	gcl := startGroupCluster(t, 1, shortDelays())
	c := gcl.client(t)
	gcl.createTopic(t, c, "PR", 2)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	pc := newPushConsumer(t, c, "GR", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			n := rec.add("a", m)
			if m.Topic != "PR" {
				t.Errorf("delivery %d of %s shows topic %s", n, m.MsgID(), m.Topic)
			}
			if got := int(m.ReconsumeTimes); got != n-1 {
				t.Errorf("delivery %d of %s: reconsume times %d", n, m.MsgID(), got)
			}
			switch id, _ := m.Property("i"); {
			case id == "dead":
				m.Result = ConsumeRetryLater
			case n <= 2:
				m.Result = ConsumeRetryLater
			}
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), WithMaxReconsumeTimes(3))
	startPush(t, pc, "PR", ByTag("*"))
	sendN(t, p, "PR", 0, 10, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Send(ctx, &Message{Topic: "PR", Body: []byte("x"), Properties: map[string]string{"i": "dead"}}); err != nil {
		t.Fatal(err)
	}
	groupCheckFor(t, 30*time.Second, func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for i := range 10 {
			if n := rec.count[strconv.Itoa(i)]; n != 3 {
				return fmt.Errorf("message %d delivered %d times, want 3", i, n)
			}
		}
		if n := rec.count["dead"]; n != 4 {
			return fmt.Errorf("the failing message was delivered %d times, want 4", n)
		}
		return nil
	})
	// The DLQ holds it, with its reconsume count.
	var dlq []protocol.MessageExt
	groupCheckFor(t, 10*time.Second, func() error {
		var err error
		dlq, err = pullTopic(ctx, c, DLQTopic("GR"))
		if err == nil && len(dlq) != 1 {
			err = fmt.Errorf("%d messages in the DLQ", len(dlq))
		}
		return err
	})
	if id, _ := dlq[0].Property("i"); id != "dead" || dlq[0].ReconsumeTimes != 4 {
		t.Errorf("DLQ holds %s with reconsume times %d", id, dlq[0].ReconsumeTimes)
	}
	if rt, _ := dlq[0].Property(protocol.PropRetryTopic); rt != "PR" {
		t.Errorf("DLQ message RETRY_TOPIC %q", rt)
	}
}

// TestPushRetryTopicRouteAppears: the group's retry topic has no route
// when the consumer starts, and the name server learns of it only a
// moment after the first send-back created it (as with a Java broker,
// which registers a topic it created at its next registration); the
// rebalance interval is a minute. The sent-back message must still come
// back within seconds: a group whose retry topic has no route yet
// rebalances as often as one waiting for a lock (retryRouteWait) instead
// of waiting a rebalance interval for the retry queue.
func TestPushRetryTopicRouteAppears(t *testing.T) {
	var hide atomic.Bool // the name server does not know the retry topic
	hide.Store(true)
	retry := RetryTopic("GRA")
	gcl := startGroupClusterNS(t, 1, []namesrv.Option{namesrv.WithRemotingOptions(remoting.WithInterceptor(
		func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
			req := rc.Request()
			if topic, _ := req.Ext("topic"); req.Code == protocol.ReqGetRouteInfoByTopic && topic == retry && hide.Load() {
				return protocol.NewResponse(req, protocol.ResTopicNotExist, "not registered yet"), true
			}
			return nil, false
		}))}, shortDelays())
	c := gcl.client(t)
	gcl.createTopic(t, c, "PRA", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	pc := newPushConsumer(t, c, "GRA", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			if rec.add("a", m) == 1 {
				m.Result = ConsumeRetryLater
			}
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), WithRebalanceInterval(time.Minute))
	startPush(t, pc, "PRA", ByTag("*"))
	sendN(t, p, "PRA", 0, 1, nil)
	groupCheckFor(t, 20*time.Second, func() error {
		if len(rec.snapshot()) == 0 {
			return fmt.Errorf("not delivered yet")
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // the broker's registration, later
	hide.Store(false)
	shown := time.Now()
	groupCheckFor(t, 10*time.Second, func() error {
		if len(rec.snapshot()) < 2 {
			return fmt.Errorf("the sent-back message did not come back within %v of its route appearing (rebalance interval 1 min)",
				time.Since(shown).Round(time.Millisecond))
		}
		return nil
	})
	d := rec.snapshot()
	if d[1].topic != "PRA" || d[1].reconsume != 1 || d[1].id != "0" {
		t.Errorf("redelivery %+v, want message 0 on topic PRA with reconsume times 1", d[1])
	}
	t.Logf("redelivered %v after the retry topic's route appeared", d[1].at.Sub(shown).Round(time.Millisecond))
}

// pullTopic reads every message of every queue of topic from offset 0.
func pullTopic(ctx context.Context, c *Client, topic string) ([]protocol.MessageExt, error) {
	r, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []protocol.MessageExt
	for _, q := range r.SubscribeQueues() {
		off := int64(0)
		for {
			res, err := c.Pull(ctx, PullRequest{Queue: q, Offset: off, MaxMsgs: 32, Group: "pull-all"})
			if err != nil {
				return nil, err
			}
			if res.Status != PullFound {
				break
			}
			for i := range res.Messages {
				out = append(out, res.Messages[i].Clone())
			}
			off = res.NextBeginOffset
		}
	}
	return out, nil
}

// failSendBack makes the broker refuse CONSUMER_SEND_MSG_BACK and the
// retry-topic sends while on is set.
func failSendBack(on *atomic.Bool) broker.Option {
	return broker.WithRemotingOptions(remoting.WithInterceptor(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
		req := rc.Request()
		if !on.Load() {
			return nil, false
		}
		switch req.Code {
		case protocol.ReqConsumerSendMsgBack:
			return protocol.NewResponse(req, protocol.ResSystemError, "injected"), true
		case protocol.ReqSendMessageV2:
			if topic, _ := req.Ext("b"); isRetryTopic(topic) {
				return protocol.NewResponse(req, protocol.ResSystemError, "injected"), true
			}
		}
		return nil, false
	}))
}

// TestPushLocalRetry refuses both send-back paths: the failed message is
// consumed again locally (its reconsume count up) and, until then, holds
// the queue's committed offset back; once it succeeds the offset passes
// it.
func TestPushLocalRetry(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	gcl := startGroupCluster(t, 1, failSendBack(&refuse))
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "PL", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	pc := newPushConsumer(t, c, "GL", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			if n := rec.add("a", m); n == 1 {
				if id, _ := m.Property("i"); id == "1" {
					m.Result = ConsumeRetryLater
				}
			}
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), withLocalRetryDelay(200*time.Millisecond), WithPersistInterval(50*time.Millisecond))
	startPush(t, pc, "PL", ByTag("*"))
	sendN(t, p, "PL", 0, 3, nil)
	groupCheckFor(t, 10*time.Second, func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.count["1"] < 2 {
			return fmt.Errorf("message 1 delivered %d times", rec.count["1"])
		}
		return nil
	})
	var second delivery
	for _, d := range rec.snapshot() {
		if d.id == "1" && second.id == "" && d.reconsume == 1 {
			second = d
		}
	}
	if second.id == "" || second.topic != "PL" {
		t.Errorf("local redelivery %+v, want message 1 from PL with reconsume times 1", second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	groupCheckFor(t, 10*time.Second, func() error {
		off, err := c.QueryConsumerOffset(ctx, "GL", qs[0])
		if err == nil && off != 3 {
			err = fmt.Errorf("committed offset %d, want 3", off)
		}
		return err
	})
}

// withLocalRetryDelay shortens the local re-consumption delay (tests).
func withLocalRetryDelay(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.localRetry = d })
}

// TestPushOrderly consumes messages of 4 queues with an orderly handler
// that fails one message twice: every queue's messages arrive in queue
// order, the failing one three times in a row (suspended, then again),
// and nothing of its queue is consumed between its attempts.
func TestPushOrderly(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c := gcl.client(t)
	gcl.createTopic(t, c, "PO", 4)
	p, err := NewProducer(c, "pg", WithSelector(HashBySharding()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	var running sync.Map // queue → true while a call runs
	pc := newPushConsumer(t, c, "GO", OrderlyHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		q := msgs[0].Queue
		if _, busy := running.LoadOrStore(q, true); busy {
			t.Errorf("two calls at once for %s", q)
		}
		defer running.Delete(q)
		for _, m := range msgs {
			if n := rec.add("a", m); n <= 2 {
				if id, _ := m.Property("i"); id == "13" {
					return errors.New("not yet")
				}
			}
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), WithSuspendTime(50*time.Millisecond), WithConsumeBatchSize(3))
	startPush(t, pc, "PO", ByTag("*"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 40 {
		m := &Message{Topic: "PO", Body: []byte("x"), ShardingKey: "k" + strconv.Itoa(i%4),
			Properties: map[string]string{"i": strconv.Itoa(i)}}
		if _, err := p.Send(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	groupCheckFor(t, 20*time.Second, func() error {
		if n := rec.distinct(); n < 40 {
			return fmt.Errorf("%d of 40", n)
		}
		return nil
	})
	checkQueueOrder(t, rec.snapshot())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.count["13"] != 3 {
		t.Errorf("message 13 delivered %d times, want 3", rec.count["13"])
	}
}

// checkQueueOrder checks that, per member and queue, deliveries go forward
// in offset order except that a failed batch is delivered again from its
// start (an offset may repeat or go back only to a batch start already
// delivered, never skip).
func checkQueueOrder(t *testing.T, ds []delivery) {
	t.Helper()
	type key struct {
		member string
		q      protocol.MessageQueue
	}
	maxSeen := map[key]int64{}
	for _, d := range ds {
		k := key{d.member, d.queue}
		last, ok := maxSeen[k]
		switch {
		case !ok:
		case d.offset > last+1:
			t.Errorf("%s %s: offset %d after %d (a gap)", d.member, d.queue, d.offset, last)
		}
		if !ok || d.offset > last {
			maxSeen[k] = d.offset
		}
	}
}

// TestPushBroadcasting runs two broadcasting consumers of one group: each
// gets every message; their offsets are in their own files, and a consumer
// started again on its file goes on from there.
func TestPushBroadcasting(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c1, c2 := gcl.client(t), gcl.client(t)
	gcl.createTopic(t, c1, "PB", 2)
	p, err := NewProducer(c1, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dir := t.TempDir()
	recs := []*recorder{newRecorder(), newRecorder()}
	var pcs []*PushConsumer
	for i, c := range []*Client{c1, c2} {
		rec := recs[i]
		pc := newPushConsumer(t, c, "GB", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
			for _, m := range msgs {
				rec.add("m", m)
			}
			return nil
		}), WithBroadcasting(), WithConsumeFrom(ConsumeFromFirst),
			WithOffsetFile(filepath.Join(dir, strconv.Itoa(i), "offsets.json")))
		startPush(t, pc, "PB", ByTag("*"))
		pcs = append(pcs, pc)
	}
	sendN(t, p, "PB", 0, 20, nil)
	for i, rec := range recs {
		groupCheckFor(t, 10*time.Second, func() error {
			if n := rec.distinct(); n != 20 {
				return fmt.Errorf("consumer %d: %d of 20", i, n)
			}
			return nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pcs[0].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// Restarted on its file: only newer messages.
	rec := newRecorder()
	pc := newPushConsumer(t, c1, "GB", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			rec.add("m", m)
		}
		return nil
	}), WithBroadcasting(), WithConsumeFrom(ConsumeFromFirst), WithOffsetFile(filepath.Join(dir, "0", "offsets.json")))
	startPush(t, pc, "PB", ByTag("*"))
	sendN(t, p, "PB", 20, 5, nil)
	groupCheckFor(t, 10*time.Second, func() error {
		if n := rec.distinct(); n != 5 {
			return fmt.Errorf("restarted consumer: %d of the 5 new messages", n)
		}
		return nil
	})
	for id := range rec.count {
		if n, _ := strconv.Atoi(id); n < 20 {
			t.Errorf("restarted consumer got old message %s", id)
		}
	}
}

// TestPushConsumeTimeout blocks a handler beyond the consume timeout: its
// ctx is cancelled, the message is sent back and comes again.
func TestPushConsumeTimeout(t *testing.T) {
	gcl := startGroupCluster(t, 1, shortDelays())
	c := gcl.client(t)
	gcl.createTopic(t, c, "PT", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	var cancelled atomic.Bool
	pc := newPushConsumer(t, c, "GT", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			if rec.add("a", m) == 1 {
				select {
				case <-ctx.Done():
					cancelled.Store(true)
				case <-time.After(20 * time.Second):
				}
			}
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), WithConsumeTimeout(200*time.Millisecond))
	startPush(t, pc, "PT", ByTag("*"))
	sendN(t, p, "PT", 0, 1, nil)
	groupCheckFor(t, 15*time.Second, func() error {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.count["0"] < 2 {
			return fmt.Errorf("delivered %d times", rec.count["0"])
		}
		return nil
	})
	if !cancelled.Load() {
		t.Error("the timed-out call's ctx was not cancelled")
	}
	if ds := rec.snapshot(); ds[1].reconsume != 1 || ds[1].queue.Topic != RetryTopic("GT") {
		t.Errorf("second delivery %+v, want reconsume 1 from the retry topic", ds[1])
	}
}

// TestPushFlowControl blocks the handler: the consumer must stop pulling
// a queue once its threshold of pulled, unconsumed messages is passed.
func TestPushFlowControl(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	c := gcl.client(t)
	gcl.createTopic(t, c, "PF", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sendN(t, p, "PF", 0, 100, nil)
	release := make(chan struct{})
	var got atomic.Int64
	pc := newPushConsumer(t, c, "GF", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		got.Add(int64(len(msgs)))
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst), WithPullBatchSize(4), WithPullThresholds(10, 1<<20, 2000), WithConsumeWorkers(2))
	startPush(t, pc, "PF", ByTag("*"))
	groupCheckFor(t, 10*time.Second, func() error {
		if got.Load() < 2 {
			return errors.New("handlers not called yet")
		}
		return nil
	})
	pulled0 := gcl.brokers[0].Stats().PulledMessages
	time.Sleep(300 * time.Millisecond) // several flow-control periods (50 ms): nothing more may come
	if pulled := gcl.brokers[0].Stats().PulledMessages; pulled > 16 || pulled != pulled0 {
		t.Errorf("the broker returned %d messages (then %d) while the handlers were blocked; threshold 10 + a pull of 4", pulled0, pulled)
	}
	close(release)
	groupCheckFor(t, 10*time.Second, func() error {
		if n := got.Load(); n < 100 {
			return fmt.Errorf("%d of 100", n)
		}
		return nil
	})
}

// TestPushSQL92 subscribes with an SQL92 selector: a broker with property
// filtering delivers only the selected messages.
func TestPushSQL92(t *testing.T) {
	gcl := startGroupCluster(t, 1, broker.WithPropertyFilter(true))
	c := gcl.client(t)
	gcl.createTopic(t, c, "PS", 2)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rec := newRecorder()
	pc := newPushConsumer(t, c, "GS", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			rec.add("a", m)
		}
		return nil
	}), WithConsumeFrom(ConsumeFromFirst))
	startPush(t, pc, "PS", BySQL92("n >= 10 AND color = 'red'"))
	sendN(t, p, "PS", 0, 30, func(i int) map[string]string {
		color := "blue"
		if i%2 == 0 {
			color = "red"
		}
		return map[string]string{"n": strconv.Itoa(i), "color": color}
	})
	groupCheckFor(t, 10*time.Second, func() error {
		if n := rec.distinct(); n != 10 {
			return fmt.Errorf("%d selected, want 10", n)
		}
		return nil
	})
	for id := range rec.count {
		if n, _ := strconv.Atoi(id); n < 10 || n%2 != 0 {
			t.Errorf("message %s does not match the selector", id)
		}
	}
}

// TestPushSQL92Refused starts a consumer with an SQL92 selector against a
// broker without property filtering: Start fails with the broker's
// SYSTEM_ERROR (CHECK_CLIENT_CONFIG), as against a Java broker.
func TestPushSQL92Refused(t *testing.T) {
	plain := startGroupCluster(t, 1)
	pc2 := plain.client(t)
	plain.createTopic(t, pc2, "PS", 1)
	cons, err := NewPushConsumer(pc2, "GS", ConcurrentHandler(func(context.Context, []*ConsumedMessage) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	if err := cons.Subscribe("PS", BySQL92("n > 1")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cons.Start(ctx); !errors.Is(err, protocol.ErrSystemError) {
		t.Errorf("Start against a broker without property filtering: %v, want SYSTEM_ERROR", err)
	}
}

// TestSendBackPull sends back a pulled message with GroupConsumer.SendBack:
// it comes again through %RETRY%<group> with its reconsume count and
// RETRY_TOPIC, after the broker's delay; past WithMaxReconsumeTimes it
// goes to the DLQ instead.
func TestSendBackPull(t *testing.T) {
	gcl := startGroupCluster(t, 1, shortDelays())
	c := gcl.client(t)
	qs := gcl.createTopic(t, c, "SB", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sendN(t, p, "SB", 0, 1, nil)
	g, err := NewGroupConsumer(c, "GSB", WithMaxReconsumeTimes(1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Subscribe("SB", "*"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := c.Pull(ctx, PullRequest{Queue: qs[0], Offset: 0, Group: "GSB"})
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("pull: %v %+v", err, res)
	}
	if err := g.SendBack(ctx, &res.Messages[0], 0); err != nil {
		t.Fatal(err)
	}
	var back []protocol.MessageExt
	groupCheckFor(t, 10*time.Second, func() error {
		var err error
		back, err = pullTopic(ctx, c, RetryTopic("GSB"))
		if err == nil && len(back) != 1 {
			err = fmt.Errorf("%d in the retry topic", len(back))
		}
		return err
	})
	m := back[0]
	if rt, _ := m.Property(protocol.PropRetryTopic); rt != "SB" || m.ReconsumeTimes != 1 {
		t.Errorf("retried message: RETRY_TOPIC %q reconsume %d", rt, m.ReconsumeTimes)
	}
	// Its second failure is past the limit of 1: dead-lettered.
	if err := g.SendBack(ctx, &m, 0); err != nil {
		t.Fatal(err)
	}
	groupCheckFor(t, 10*time.Second, func() error {
		dlq, err := pullTopic(ctx, c, DLQTopic("GSB"))
		if err == nil && len(dlq) != 1 {
			err = fmt.Errorf("%d in the DLQ", len(dlq))
		}
		return err
	})
}

type traceKey struct{}

// traceHook is a HookConsume and HookConsumed that puts the message's
// "trace" property in its context.
type traceHook struct {
	mu       sync.Mutex
	consumed map[string]ConsumeResult
}

func (h *traceHook) OnConsume(ctx context.Context, _ string, m *protocol.MessageExt) context.Context {
	v, _ := m.Property("trace")
	return context.WithValue(ctx, traceKey{}, v)
}

func (h *traceHook) OnConsumed(ctx context.Context, _ string, m *protocol.MessageExt, r ConsumeResult, _ time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.consumed[ctx.Value(traceKey{}).(string)] = r
}

// TestPushHooksAndShutdown: each message's Context carries what the
// consume hook took from it; Shutdown waits for a handler call in
// progress, whose message is then committed (not consumed again by the
// next consumer of the group).
func TestPushHooksAndShutdown(t *testing.T) {
	gcl := startGroupCluster(t, 1)
	hook := &traceHook{consumed: map[string]ConsumeResult{}}
	c, err := New(WithNameServers(gcl.ns.Addr()), WithHooks(hook), WithLogger(groupTestLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	qs := gcl.createTopic(t, c, "PH", 1)
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	started := make(chan struct{}, 10)
	var traces sync.Map
	pc := newPushConsumer(t, c, "GH", ConcurrentHandler(func(ctx context.Context, msgs []*ConsumedMessage) error {
		for _, m := range msgs {
			traces.Store(m.Context().Value(traceKey{}), true)
		}
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond) // still running when Shutdown begins
		return nil
	}), WithConsumeFrom(ConsumeFromFirst))
	startPush(t, pc, "PH", ByTag("*"))
	sendN(t, p, "PH", 0, 1, func(int) map[string]string { return map[string]string{"trace": "t-0"} })
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := traces.Load("t-0"); !ok {
		t.Error("the message's context lacks the hook's value")
	}
	hook.mu.Lock()
	if r, ok := hook.consumed["t-0"]; !ok || r != ConsumeSuccess {
		t.Errorf("HookConsumed saw %v %v", r, ok)
	}
	hook.mu.Unlock()
	if off, err := c.QueryConsumerOffset(ctx, "GH", qs[0]); err != nil || off != 1 {
		t.Errorf("committed offset after Shutdown: %d %v, want 1", off, err)
	}
}
