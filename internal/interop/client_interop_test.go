package interop

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The client interop tests put runnel's client (transport/client) and the
// official Go client on the two ends of runnel's embedded broker: runnel's
// Producer feeds the official push and lite pull consumers, the official
// producer feeds runnel's Pull primitive and GroupConsumer members, and
// runnel's transactions (half message + EndTransaction by handle, and the
// check-back listener) are observed by an official consumer. Every message
// is recorded in a ledger when sent and compared field by field when it
// arrives: body, tags, keys, user properties, born timestamp (within the
// send window), UNIQ_KEY, offset message id, queue and queue offset (where
// the sender knows them), and the delay of delay-level messages.
//
// These tests are not parallel: each ends by checking that no goroutine of
// runnel's client package is left once its Clients are closed, which would
// be inexact while another test's runnel Clients run.

// cixTimeout bounds one runnel client call in these tests.
const cixTimeout = 15 * time.Second

func cixCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), cixTimeout)
	tb.Cleanup(cancel)
	return ctx
}

// newRunnelClient returns a runnel Client of env's name server, closed at
// test end (tests close it earlier to check for leaks; Close is idempotent).
func newRunnelClient(tb testing.TB, env *brokerEnv, opts ...client.Option) *client.Client {
	tb.Helper()
	all := append([]client.Option{client.WithNameServers(env.nsAddr), client.WithRequestTimeout(10 * time.Second)}, opts...)
	c, err := client.New(all...)
	if err != nil {
		tb.Fatalf("client.New: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// newRunnelProducer returns a runnel Producer on c, closed at test end.
func newRunnelProducer(tb testing.TB, c *client.Client, group string, opts ...client.ProducerOption) *client.Producer {
	tb.Helper()
	p, err := client.NewProducer(c, group, opts...)
	if err != nil {
		tb.Fatalf("client.NewProducer: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// checkNoClientGoroutines makes the test, once everything else of it was
// cleaned up, wait until no goroutine runs code of runnel's client package:
// every Client must be closed by then, the embedded cluster's own included
// (registered first, this cleanup runs last). The official client's
// goroutines, which outlive its Shutdown, are ignored.
func checkNoClientGoroutines(tb testing.TB) {
	tb.Helper()
	tb.Cleanup(func() { noClientGoroutines(tb) })
}

func noClientGoroutines(tb testing.TB) {
	tb.Helper()
	const marker = "github.com/runnel-dev/runnel/transport/client."
	var last string
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		last = ""
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, marker) {
				last = g
				break
			}
		}
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("a goroutine of runnel's client outlived every Client:\n%s", last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runnelMessage converts what e carries into a runnel Message.
func runnelMessage(e *expect) *client.Message {
	return &client.Message{Topic: e.topic, Body: e.body, Tags: e.tags, Keys: slices.Clone(e.keys), Properties: maps.Clone(e.props)}
}

// sentRunnel completes the ledger entries of msgs (one send, or one batch)
// with the born-time window and runnel's SendResult; a batch result's ids
// are comma-joined and its offset is that of the first message.
func (l *ledger) sentRunnel(tb testing.TB, es []*expect, before, after time.Time, res client.SendResult) {
	tb.Helper()
	ids, offIDs := strings.Split(res.MsgID, ","), strings.Split(res.OffsetMsgID, ",")
	if len(ids) != len(es) || len(offIDs) != len(es) {
		tb.Fatalf("send result of %d messages has %d msg ids and %d offset msg ids: %+v", len(es), len(ids), len(offIDs), res)
	}
	if res.Status != client.SendOK {
		tb.Fatalf("send status %v", res.Status)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range es {
		e.bornMin, e.bornMax = before.UnixMilli(), after.UnixMilli()
		e.offID = offIDs[i]
		e.queue, e.offset = int(res.Queue.QueueID), res.QueueOffset+int64(i)
	}
}

// sendRunnel sends msgs (one message or a batch) with p.Send and records
// the result in l.
func (l *ledger) sendRunnel(tb testing.TB, p *client.Producer, es ...*expect) client.SendResult {
	tb.Helper()
	msgs := make([]*client.Message, len(es))
	for i, e := range es {
		msgs[i] = runnelMessage(e)
	}
	before := time.Now()
	res, err := p.Send(cixCtx(tb), msgs...)
	after := time.Now()
	if err != nil {
		tb.Fatalf("runnel Send of %d: %v", len(msgs), err)
	}
	l.sentRunnel(tb, es, before, after, res)
	return res
}

// sendHalfRunnel sends e as a half message with runnel's SendHalf and
// records it in the ledger under the handle's message id (a check-back
// carries the half message, whose queue is the half topic's, so only ids
// are compared).
func (l *ledger) sendHalfRunnel(tb testing.TB, p *client.Producer, e *expect) client.TxHandle {
	tb.Helper()
	before := time.Now()
	h, err := p.SendHalf(cixCtx(tb), runnelMessage(e))
	if err != nil {
		tb.Fatalf("SendHalf: %v", err)
	}
	l.sent(e, before, time.Now(), nil)
	l.mu.Lock()
	e.msgID = h.MsgID
	l.mu.Unlock()
	return h
}

// TestRunnelProducerToOfficialConsumers sends with every mode of runnel's
// Producer (sync, async, oneway, batch, HashBySharding with sharding keys,
// delay level) and checks that an official push consumer and an official
// lite pull consumer (queues assigned) each receive every message exactly
// once, as sent, at the queue and offset runnel's SendResult acknowledged.
// Sharded messages land on the queue the official hash selector picks for
// their key, in send order; the delay-level message arrives after its
// delay with DELAY cleared and REAL_TOPIC set.
func TestRunnelProducerToOfficialConsumers(t *testing.T) {
	checkNoClientGoroutines(t)
	env := startBrokerEnv(t)
	const queues = 4
	topic := uniqueName("RtoO")
	createTopic(t, env, topic, queues)
	c := newRunnelClient(t, env)
	p := newRunnelProducer(t, c, uniqueName("rpg"))
	ps := newRunnelProducer(t, c, uniqueName("rpgHash"), client.WithSelector(client.HashBySharding()))
	l := newLedger()
	recordingConsumer(t, env, l, uniqueName("cgRtoO"), topic, "push")

	// sync
	for range 10 {
		_, e := l.message(topic, 600)
		l.sendRunnel(t, p, e)
	}
	// async
	var wg sync.WaitGroup
	var asyncErr error
	var asyncMu sync.Mutex
	for range 10 {
		_, e := l.message(topic, 600)
		wg.Add(1)
		before := time.Now()
		p.SendAsync(cixCtx(t), func(res client.SendResult, err error) {
			defer wg.Done()
			if err != nil {
				asyncMu.Lock()
				asyncErr = errors.Join(asyncErr, err)
				asyncMu.Unlock()
				return
			}
			l.sentRunnel(t, []*expect{e}, before, time.Now(), res)
		}, runnelMessage(e))
	}
	waitGroupTimeout(t, &wg, 10*time.Second, "async send callbacks")
	if asyncErr != nil {
		t.Fatalf("SendAsync: %v", asyncErr)
	}
	// oneway: nothing acknowledged but the born window
	for range 3 {
		_, e := l.message(topic, 300)
		before := time.Now()
		if err := p.SendOneway(cixCtx(t), runnelMessage(e)); err != nil {
			t.Fatalf("SendOneway: %v", err)
		}
		l.sent(e, before, time.Now(), nil)
	}
	// batch
	batch := make([]*expect, 5)
	for i := range batch {
		_, batch[i] = l.message(topic, 400)
	}
	l.sendRunnel(t, p, batch...)

	// sharding keys: each key's messages go to the queue the official
	// client's hash selector picks for it, in send order.
	route, err := c.Route(cixCtx(t), topic)
	if err != nil {
		t.Fatalf("Route: %v", err)
	}
	var oqs []*primitive.MessageQueue
	for _, q := range route.PublishQueues() {
		oqs = append(oqs, &primitive.MessageQueue{Topic: q.Topic, BrokerName: q.BrokerName, QueueId: int(q.QueueID)})
	}
	if len(oqs) != queues {
		t.Fatalf("route publishes %d queues, want %d", len(oqs), queues)
	}
	officialHash := producer.NewHashQueueSelector()
	shardOf := map[string]string{} // message id -> sharding key
	lastOffset := map[string]int64{}
	for i := range 12 {
		key := fmt.Sprintf("order-%d", i%3)
		_, e := l.message(topic, 200)
		m := runnelMessage(e)
		m.ShardingKey = key
		before := time.Now()
		res, err := ps.Send(cixCtx(t), m)
		if err != nil {
			t.Fatalf("sharded Send: %v", err)
		}
		l.sentRunnel(t, []*expect{e}, before, time.Now(), res)
		om := primitive.NewMessage(topic, nil).WithShardingKey(key)
		if want := officialHash.Select(om, oqs, ""); int(res.Queue.QueueID) != want.QueueId {
			t.Errorf("key %s went to queue %d; the official hash selector picks %d", key, res.Queue.QueueID, want.QueueId)
		}
		if prev, ok := lastOffset[key]; ok && res.QueueOffset <= prev {
			t.Errorf("key %s: offset %d after %d", key, res.QueueOffset, prev)
		}
		lastOffset[key] = res.QueueOffset
		shardOf[e.id] = key
	}

	// delay level 1 (1 s): stored in the schedule topic first, so its
	// acknowledged offset and offset id are not where it is delivered.
	_, de := l.message(topic, 100)
	dm := runnelMessage(de)
	dm.DelayLevel = 1
	delayStart := time.Now()
	res, err := p.Send(cixCtx(t), dm)
	if err != nil {
		t.Fatalf("delayed Send: %v", err)
	}
	l.sentRunnel(t, []*expect{de}, delayStart, time.Now(), res)
	l.mu.Lock()
	de.offset, de.offID = -1, ""
	l.mu.Unlock()

	l.waitAll(t, 20*time.Second, "push")

	// The lite pull consumer, assigned every queue, reads them all.
	lp := newLitePull(t, env, uniqueName("cgRtoOLite"))
	if err := lp.Assign(topic, oqs); err != nil {
		t.Fatalf("Assign: %v", err)
	}
	if err := lp.Start(); err != nil {
		t.Fatalf("lite pull Start: %v", err)
	}
	pollInto(t, lp, l, "pull", func() bool { return l.deliveredAll("pull") })
	l.verify(t, []string{"push", "pull"}, 1)

	for id, key := range shardOf {
		for _, r := range l.deliveries(id) {
			if got := r.msg.GetProperty(protocol.PropShardingKeyJava); got != key {
				t.Errorf("sharded message %s: %s=%q, want %q", id, protocol.PropShardingKeyJava, got, key)
			}
		}
	}
	for _, r := range l.deliveries(de.id) {
		if r.member == "push" {
			if d := r.at.Sub(delayStart); d < time.Second || d > 8*time.Second {
				t.Errorf("delay level 1 message delivered %v after its send", d)
			}
		}
		if v := r.msg.GetProperty(primitive.PropertyDelayTimeLevel); v != "" {
			t.Errorf("delivered delayed message still has DELAY=%q", v)
		}
		if v := r.msg.GetProperty(primitive.PropertyRealTopic); v != topic {
			t.Errorf("delivered delayed message has REAL_TOPIC=%q, want %q", v, topic)
		}
	}

	_ = ps.Close()
	_ = p.Close()
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// rgot is one delivery of a message to a runnel consumer.
type rgot struct {
	member string
	at     time.Time
	msg    protocol.MessageExt // cloned off the pull response
}

// rledger records deliveries to runnel consumers of the messages of a
// ledger. Safe for concurrent use.
type rledger struct {
	l  *ledger
	mu struct {
		sync.Mutex
		got     map[string][]rgot
		foreign int
	}
}

func newRLedger(l *ledger) *rledger {
	r := &rledger{l: l}
	r.mu.got = make(map[string][]rgot)
	return r
}

// record notes the delivery of m (aliasing a pull response) to member.
func (r *rledger) record(member string, m *protocol.MessageExt) {
	now := time.Now()
	id, _ := m.Property(idProp)
	r.l.mu.Lock()
	_, known := r.l.mu.want[id]
	r.l.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !known {
		r.mu.foreign++
		return
	}
	r.mu.got[id] = append(r.mu.got[id], rgot{member: member, at: now, msg: m.Clone()})
}

// delivered counts the deliveries of id to members accepted by who.
func (r *rledger) delivered(id string, who func(string) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.mu.got[id] {
		if who(g.member) {
			n++
		}
	}
	return n
}

func (r *rledger) deliveredAll(who func(string) bool) bool {
	for _, e := range r.l.expected() {
		if r.delivered(e.id, who) == 0 {
			return false
		}
	}
	return true
}

// verify requires exactly want deliveries of every message to the members
// accepted by who, each identical to what was sent.
func (r *rledger) verify(tb testing.TB, who func(string) bool, want int) {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.foreign != 0 {
		tb.Errorf("%d deliveries of messages this test never sent", r.mu.foreign)
	}
	bad := 0
	for _, e := range r.l.expected() {
		n := 0
		for _, g := range r.mu.got[e.id] {
			if !who(g.member) {
				continue
			}
			n++
			if err := e.compareRunnel(&g.msg); err != nil {
				tb.Errorf("message %s delivered to %s: %v", e.id, g.member, err)
				bad++
			}
		}
		if n != want {
			tb.Errorf("message %s delivered %d times, want %d", e.id, n, want)
			bad++
		}
		if bad > 20 {
			tb.Fatalf("too many mismatches; stopping")
		}
	}
}

// compareRunnel checks a message as runnel's Pull returned it against what
// was sent, through runnel's own accessors.
func (e *expect) compareRunnel(m *protocol.MessageExt) error {
	var errs []string
	prop := func(k string) string { v, _ := m.Property(k); return v }
	if err := e.compareContent(m.Body, m.Tags(), m.Keys(), prop, m.BornTimestamp); err != nil {
		errs = append(errs, err.Error())
	}
	if m.Topic != e.topic {
		errs = append(errs, fmt.Sprintf("topic %q, want %q", m.Topic, e.topic))
	}
	if m.StoreTimestamp < m.BornTimestamp-1000 {
		errs = append(errs, fmt.Sprintf("store timestamp %d long before born timestamp %d", m.StoreTimestamp, m.BornTimestamp))
	}
	if e.msgID != "" && m.UniqKey() != e.msgID {
		errs = append(errs, fmt.Sprintf("UNIQ_KEY %q, want %q", m.UniqKey(), e.msgID))
	}
	// MsgID is the UNIQ_KEY, or the offset id when the producer set none
	// (the official client's batches), as the Java client's getMsgId.
	if want := cmp.Or(m.UniqKey(), m.OffsetMsgID()); m.MsgID() != want {
		errs = append(errs, fmt.Sprintf("MsgID() %q, want %q", m.MsgID(), want))
	}
	if e.offID != "" && m.OffsetMsgID() != e.offID {
		errs = append(errs, fmt.Sprintf("offset msg id %q, want %q", m.OffsetMsgID(), e.offID))
	}
	if e.queue >= 0 && int(m.QueueID) != e.queue {
		errs = append(errs, fmt.Sprintf("queue %d, want %d", m.QueueID, e.queue))
	}
	if e.offset >= 0 && m.QueueOffset != e.offset {
		errs = append(errs, fmt.Sprintf("queue offset %d, want %d", m.QueueOffset, e.offset))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// pullQueue long-polls q from offset 0 with runnel's Pull primitive until
// ctx ends, recording every message under member. An unexpected status or
// error is reported through fail.
func pullQueue(ctx context.Context, c *client.Client, r *rledger, member, group string, q protocol.MessageQueue, fail func(error)) {
	off := int64(0)
	for ctx.Err() == nil {
		res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 8, Suspend: 500 * time.Millisecond, Group: group})
		if err != nil {
			if ctx.Err() == nil {
				fail(fmt.Errorf("pull %s @%d: %w", q, off, err))
			}
			return
		}
		switch res.Status {
		case client.PullFound:
			for i := range res.Messages {
				m := &res.Messages[i]
				if m.QueueOffset != off+int64(i) {
					fail(fmt.Errorf("pull %s @%d: message %d has offset %d", q, off, i, m.QueueOffset))
				}
				r.record(member, m)
			}
			off = res.NextBeginOffset
		case client.PullNoNewMsg:
		default:
			fail(fmt.Errorf("pull %s @%d: status %v", q, off, res.Status))
			return
		}
	}
}

// TestOfficialProducerToRunnelConsumers sends with the official producer
// (sync, async, batch, delay level) and reads every message with runnel's
// Pull primitive (long polling every queue) and with two runnel
// GroupConsumer members whose rebalance listeners hand them their queues:
// the Pull reader gets each message once, the two members together get each
// once (each only from the queues its listener was given), all as sent.
func TestOfficialProducerToRunnelConsumers(t *testing.T) {
	checkNoClientGoroutines(t)
	env := startBrokerEnv(t)
	const queues = 4
	topic := uniqueName("OtoR")
	createTopic(t, env, topic, queues)
	l := newLedger()
	r := newRLedger(l)

	// Two group members, settled on a split of the queues before anything
	// is sent, so that each pulls only the queues it was given.
	group := uniqueName("cgOtoR")
	type member struct {
		name string
		c    *client.Client
		g    *client.GroupConsumer
		mu   sync.Mutex
		own  map[protocol.MessageQueue]bool // by the listener's calls
		bad  []string
	}
	members := []*member{{name: "a"}, {name: "b"}}
	for _, m := range members {
		m.own = map[protocol.MessageQueue]bool{}
		m.c = newRunnelClient(t, env)
		g, err := client.NewGroupConsumer(m.c, group, client.WithRebalanceInterval(time.Second),
			client.WithListener(client.ListenerFuncs{
				Assign: func(_ context.Context, qs []protocol.MessageQueue) {
					m.mu.Lock()
					defer m.mu.Unlock()
					for _, q := range qs {
						if m.own[q] {
							m.bad = append(m.bad, "assigned twice: "+q.String())
						}
						m.own[q] = true
					}
				},
				Revoke: func(_ context.Context, qs []protocol.MessageQueue) {
					m.mu.Lock()
					defer m.mu.Unlock()
					for _, q := range qs {
						if !m.own[q] {
							m.bad = append(m.bad, "revoked unowned: "+q.String())
						}
						delete(m.own, q)
					}
				},
			}))
		if err != nil {
			t.Fatalf("NewGroupConsumer: %v", err)
		}
		m.g = g
		t.Cleanup(func() { _ = g.Close() })
		if err := g.Subscribe(topic, "*"); err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		if err := g.Start(cixCtx(t)); err != nil {
			t.Fatalf("Start %s: %v", m.name, err)
		}
	}
	owned := func(m *member) []protocol.MessageQueue {
		m.mu.Lock()
		defer m.mu.Unlock()
		return slices.SortedFunc(maps.Keys(m.own), protocol.MessageQueue.Compare)
	}
	waitUntil(t, 15*time.Second, "the two members to split the queues", func() bool {
		a, b := owned(members[0]), owned(members[1])
		if len(a) == 0 || len(b) == 0 || len(a)+len(b) != queues {
			return false
		}
		for _, q := range a {
			if slices.Contains(b, q) {
				return false
			}
		}
		return slices.Equal(a, members[0].g.Assignment()) && slices.Equal(b, members[1].g.Assignment())
	})
	split := map[string][]protocol.MessageQueue{"a": owned(members[0]), "b": owned(members[1])}
	t.Logf("queues split: a=%v b=%v", split["a"], split["b"])

	// The readers: one Pull loop per queue, and each member's queues.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failMu sync.Mutex
	var failed error
	fail := func(err error) {
		failMu.Lock()
		failed = errors.Join(failed, err)
		failMu.Unlock()
	}
	reader := newRunnelClient(t, env)
	route, err := reader.Route(cixCtx(t), topic)
	if err != nil {
		t.Fatalf("Route: %v", err)
	}
	if n := len(route.SubscribeQueues()); n != queues {
		t.Fatalf("route has %d readable queues, want %d", n, queues)
	}
	pullGroup := uniqueName("cgOtoRPull")
	for _, q := range route.SubscribeQueues() {
		wg.Go(func() { pullQueue(ctx, reader, r, "pull", pullGroup, q, fail) })
	}
	for _, m := range members {
		for _, q := range split[m.name] {
			wg.Go(func() { pullQueue(ctx, m.c, r, m.name, group, q, fail) })
		}
	}
	stop := func() { cancel(); wg.Wait() }
	defer stop()

	p := newProducer(t, env)
	for range 10 {
		m, e := l.message(topic, 700)
		l.sendSync(t, p, m, e)
	}
	var swg sync.WaitGroup
	for range 10 {
		m, e := l.message(topic, 700)
		swg.Add(1)
		before := time.Now()
		err := p.SendAsync(cixCtx(t), func(_ context.Context, res *primitive.SendResult, err error) {
			defer swg.Done()
			if err != nil {
				fail(fmt.Errorf("official SendAsync: %w", err))
				l.drop(e)
				return
			}
			l.sent(e, before, time.Now(), res)
		}, m)
		if err != nil {
			t.Fatalf("SendAsync: %v", err)
		}
	}
	waitGroupTimeout(t, &swg, 10*time.Second, "official async callbacks")
	// batch: the official result's offset ids are comma-joined (its MsgID
	// is empty for a batch, so the UNIQ_KEYs go unchecked there)
	var bms []*primitive.Message
	var bes []*expect
	for range 5 {
		m, e := l.message(topic, 300)
		bms, bes = append(bms, m), append(bes, e)
	}
	before := time.Now()
	bres, err := p.SendSync(cixCtx(t), bms...)
	if err != nil || bres.Status != primitive.SendOK {
		t.Fatalf("official batch SendSync: %v %v", bres, err)
	}
	after := time.Now()
	offIDs := strings.Split(bres.OffsetMsgID, ",")
	if len(offIDs) != len(bes) {
		t.Fatalf("official batch result of %d messages: msg ids %q, offset msg ids %q", len(bes), bres.MsgID, bres.OffsetMsgID)
	}
	for i, e := range bes {
		l.sent(e, before, after, nil)
		l.mu.Lock()
		e.offID = offIDs[i]
		e.queue, e.offset = bres.MessageQueue.QueueId, bres.QueueOffset+int64(i)
		l.mu.Unlock()
	}
	// delay level 1
	dm, de := l.message(topic, 100)
	dm.WithDelayTimeLevel(1)
	delayStart := time.Now()
	l.sendSync(t, p, dm, de)
	l.mu.Lock()
	de.offset, de.offID = -1, ""
	l.mu.Unlock()

	isPull := func(m string) bool { return m == "pull" }
	isMember := func(m string) bool { return m == "a" || m == "b" }
	waitUntil(t, 20*time.Second, "every message at both readers", func() bool {
		failMu.Lock()
		f := failed
		failMu.Unlock()
		if f != nil {
			t.Fatalf("readers: %v", f)
		}
		return r.deliveredAll(isPull) && r.deliveredAll(isMember)
	})
	stop()
	if failed != nil {
		t.Fatalf("readers: %v", failed)
	}
	r.verify(t, isPull, 1)
	r.verify(t, isMember, 1)
	r.mu.Lock()
	for id, gs := range r.mu.got {
		for _, g := range gs {
			if isMember(g.member) && !slices.Contains(split[g.member], protocol.MessageQueue{Topic: topic, BrokerName: broker0, QueueID: g.msg.QueueID}) {
				t.Errorf("message %s of queue %d read by %s, whose queues are %v", id, g.msg.QueueID, g.member, split[g.member])
			}
			if id == de.id && g.at.Sub(delayStart) < time.Second {
				t.Errorf("delay level 1 message read by %s %v after its send", g.member, g.at.Sub(delayStart))
			}
		}
	}
	r.mu.Unlock()

	// Leaving: each member's listener is told to give up every queue.
	for _, m := range members {
		if err := m.g.Close(); err != nil {
			t.Errorf("GroupConsumer %s Close: %v", m.name, err)
		}
		m.mu.Lock()
		if len(m.own) != 0 || len(m.bad) != 0 {
			t.Errorf("member %s after Close: still owns %v; listener misuse %v", m.name, m.own, m.bad)
		}
		m.mu.Unlock()
		if err := m.c.Close(); err != nil {
			t.Errorf("Client Close: %v", err)
		}
	}
	if err := reader.Close(); err != nil {
		t.Errorf("Client Close: %v", err)
	}
}

// visibleCount sums the max offsets of topic's queues: how many messages
// are stored in the topic.
func visibleCount(tb testing.TB, c *client.Client, topic string) int64 {
	tb.Helper()
	route, err := c.RefreshRoute(cixCtx(tb), topic)
	if err != nil {
		tb.Fatalf("Route: %v", err)
	}
	var n int64
	for _, q := range route.SubscribeQueues() {
		mx, err := c.MaxOffset(cixCtx(tb), q)
		if err != nil {
			tb.Fatalf("MaxOffset %s: %v", q, err)
		}
		n += mx
	}
	return n
}

// TestRunnelTransactionsToOfficialConsumer sends two half messages with
// runnel's SendHalf: neither is visible to an official push consumer
// before a later plain message is; then one is committed by EndTransaction
// from another Producer of the group, with its TxHandle restored from JSON
// (as after a restart), and the other rolled back. The committed message
// arrives exactly once, as sent, under its UNIQ_KEY; the rolled-back one is
// never stored in the topic.
func TestRunnelTransactionsToOfficialConsumer(t *testing.T) {
	checkNoClientGoroutines(t)
	env := startBrokerEnv(t)
	topic := uniqueName("RTx")
	createTopic(t, env, topic, 1)
	pg := uniqueName("rtxpg")
	c := newRunnelClient(t, env)
	p := newRunnelProducer(t, c, pg)
	l := newLedger()
	recordingConsumer(t, env, l, uniqueName("cgRTx"), topic, "push")

	half := func() (*expect, client.TxHandle) {
		_, e := l.message(topic, 300)
		h := l.sendHalfRunnel(t, p, e)
		if h.MsgID == "" || h.ProducerGroup != pg || h.Topic != topic {
			t.Fatalf("TxHandle %+v", h)
		}
		return e, h
	}
	ce, ch := half()
	re, rh := half()
	l.drop(re) // never to be delivered: a delivery counts as foreign

	// A plain message after both halves arrives; the halves do not.
	_, m1 := l.message(topic, 100)
	l.sendRunnel(t, p, m1)
	waitUntil(t, 10*time.Second, "the first plain message", func() bool { return len(l.deliveries(m1.id)) > 0 })
	if n := len(l.deliveries(ce.id)); n != 0 {
		t.Fatalf("half message delivered %d times before its commit", n)
	}
	if n := visibleCount(t, c, topic); n != 1 {
		t.Fatalf("%d messages stored in the topic before the commit, want 1", n)
	}

	// Commit from a second client and producer of the group, with the
	// handle as a checkpoint would restore it.
	raw, err := json.Marshal(ch)
	if err != nil {
		t.Fatal(err)
	}
	var restored client.TxHandle
	if err := json.Unmarshal(raw, &restored); err != nil {
		t.Fatal(err)
	}
	c2 := newRunnelClient(t, env)
	p2 := newRunnelProducer(t, c2, pg)
	if err := p2.EndTransaction(cixCtx(t), restored, true); err != nil {
		t.Fatalf("EndTransaction commit: %v", err)
	}
	if err := p.EndTransaction(cixCtx(t), rh, false); err != nil {
		t.Fatalf("EndTransaction rollback: %v", err)
	}
	_, m2 := l.message(topic, 100)
	l.sendRunnel(t, p, m2)
	l.waitAll(t, 10*time.Second, "push")
	l.verify(t, []string{"push"}, 1)
	// marker, committed message, marker: the rolled-back one is not there
	if n := visibleCount(t, c, topic); n != 3 {
		t.Errorf("%d messages stored in the topic, want 3 (the rollback must store nothing)", n)
	}
	got := l.deliveries(ce.id)[0].msg
	// As a Java broker does, the commit clears TRAN_MSG and keeps PGROUP.
	if got.GetProperty(primitive.PropertyTransactionPrepared) != "" || got.GetProperty(primitive.PropertyProducerGroup) != pg {
		t.Errorf("committed message properties: TRAN_MSG=%q PGROUP=%q", got.GetProperty(primitive.PropertyTransactionPrepared), got.GetProperty(primitive.PropertyProducerGroup))
	}

	for _, cl := range []*client.Client{c, c2} {
		if err := cl.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// TestRunnelCheckListener leaves three half messages undecided; the broker
// (checking every 100 ms, after 500 ms) asks runnel's check listener,
// which commits one, rolls one back, and answers unknown for the third
// until the second check, then commits. The listener sees each half
// message as sent (with PGROUP and TRAN_MSG); an official push consumer
// gets the two committed messages exactly once and the rolled-back one
// never.
func TestRunnelCheckListener(t *testing.T) {
	checkNoClientGoroutines(t)
	env := startBrokerEnv(t, broker.WithTransactionCheckInterval(100*time.Millisecond),
		broker.WithTransactionTimeout(500*time.Millisecond))
	topic := uniqueName("RCheck")
	createTopic(t, env, topic, 2)
	pg := uniqueName("rcheckpg")
	l := newLedger()
	var mu sync.Mutex
	checks := map[string]int{}    // want -> checks
	checked := map[string]error{} // message id -> comparison with what was sent
	wants := map[string]string{}  // message id -> want
	c := newRunnelClient(t, env)
	p := newRunnelProducer(t, c, pg, client.WithCheckListener(func(_ context.Context, m *protocol.MessageExt) client.TxState {
		id, _ := m.Property(idProp)
		want, _ := m.Property("want")
		var e *expect
		l.mu.Lock()
		if x, ok := l.mu.want[id]; ok {
			cp := *x
			e = &cp
		}
		l.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		checks[want]++
		err := fmt.Errorf("check-back of a message this test did not send (id %q)", id)
		if e == nil {
			e = &expect{}
		}
		if id == e.id {
			err = e.compareRunnel(m)
			if v, _ := m.Property(protocol.PropProducerGroup); v != pg {
				err = errors.Join(err, fmt.Errorf("PGROUP %q, want %q", v, pg))
			}
			if v, _ := m.Property(protocol.PropTransactionPrepared); v != "true" {
				err = errors.Join(err, fmt.Errorf("TRAN_MSG %q", v))
			}
		}
		checked[id] = errors.Join(checked[id], err)
		switch {
		case want == "commit", want == "unknown-then-commit" && checks[want] >= 2:
			return client.TxCommit
		case want == "rollback":
			return client.TxRollback
		}
		return client.TxUnknown
	}))
	recordingConsumer(t, env, l, uniqueName("cgRCheck"), topic, "push")

	var rollbackID string
	for _, want := range []string{"commit", "rollback", "unknown-then-commit"} {
		_, e := l.message(topic, 300, "want", want)
		l.sendHalfRunnel(t, p, e)
		mu.Lock()
		wants[e.id] = want
		mu.Unlock()
		if want == "rollback" {
			rollbackID = e.id
		}
	}
	waitUntil(t, 20*time.Second, "check-backs of all three", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return checks["commit"] >= 1 && checks["rollback"] >= 1 && checks["unknown-then-commit"] >= 2
	})
	// The consumer must see the two commits; the rollback must stay out.
	l.mu.Lock()
	rollback := *l.mu.want[rollbackID]
	l.mu.Unlock()
	l.drop(&rollback)
	l.waitAll(t, 10*time.Second, "push")
	l.verify(t, []string{"push"}, 1)
	if n := visibleCount(t, c, topic); n != 2 {
		t.Errorf("%d messages stored in the topic, want 2", n)
	}
	mu.Lock()
	for id, err := range checked {
		if err != nil {
			t.Errorf("check-back of %s (%s): %v", id, wants[id], err)
		}
	}
	mu.Unlock()

	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
