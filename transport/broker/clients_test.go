package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil/poll"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// ---- helpers shared by the subsystem tests (prefixed sub to stay clear of
// the core's test helpers) ----

// subLeakCheck checks, after every cleanup of the test (the broker's
// Close among them), that the test left no goroutine behind.
func subLeakCheck(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// subClock is a test clock: real time plus a jump the test controls, so
// delays of seconds to hours pass at once while real-time tickers run.
type subClock struct{ skew atomic.Int64 }

func (c *subClock) now() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }

func (c *subClock) advance(d time.Duration) { c.skew.Add(int64(d)) }

// subBroker starts a broker on 127.0.0.1:0 with its data in dir and clock
// c, closed at cleanup (closing it earlier is fine).
func subBroker(t testing.TB, dir string, c *subClock, opts ...Option) *Broker {
	t.Helper()
	b := newStartedBroker(t, append([]Option{WithDataDir(dir), WithClock(c.now)}, opts...)...)
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close broker: %v", err)
		}
	})
	return b
}

// subClient is a client connection that records the requests the broker
// sends it (NOTIFY_CONSUMER_IDS_CHANGED, PUSH_REPLY_MESSAGE_TO_CLIENT).
type subClient struct {
	*remoting.Conn
	id string

	mu       sync.Mutex
	received []*protocol.Command
	got      chan struct{} // signalled (non-blocking) on each request
}

func subDial(t testing.TB, b *Broker, clientID string) *subClient {
	t.Helper()
	c := &subClient{id: clientID, got: make(chan struct{}, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := remoting.Dial(ctx, b.Addr(), remoting.WithVersion(317), remoting.WithLanguage(protocol.LanguageGo),
		remoting.WithRequestHandler(func(ctx context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
			c.mu.Lock()
			c.received = append(c.received, req)
			c.mu.Unlock()
			select {
			case c.got <- struct{}{}:
			default:
			}
			return protocol.NewResponse(req, protocol.ResSuccess, "")
		}))
	if err != nil {
		t.Fatal(err)
	}
	c.Conn = conn
	t.Cleanup(func() { _ = conn.Close() })
	return c
}

// requests returns the received requests with the given code.
func (c *subClient) requests(code int32) []*protocol.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*protocol.Command
	for _, r := range c.received {
		if r.Code == code {
			out = append(out, r)
		}
	}
	return out
}

func (c *subClient) invoke(t testing.TB, req *protocol.Command) *protocol.Command {
	t.Helper()
	return invoke(t, c.Conn, req)
}

// heartbeat sends a HEART_BEAT for consumer group (subscribed to topics
// with "*") and/or producer group.
func (c *subClient) heartbeat(t testing.TB, consumerGroup, producerGroup string, topics ...string) *protocol.Command {
	t.Helper()
	hb := protocol.HeartbeatData{ClientID: c.id}
	if consumerGroup != "" {
		cd := protocol.ConsumerData{GroupName: consumerGroup, ConsumeType: protocol.ConsumePassively,
			MessageModel: protocol.MessageModelClustering, ConsumeFromWhere: protocol.ConsumeFromLastOffset}
		for i, tp := range topics {
			cd.SubscriptionDataSet = append(cd.SubscriptionDataSet, protocol.NewTagSubscription(tp, "*", int64(i+1)))
		}
		hb.ConsumerDataSet = append(hb.ConsumerDataSet, cd)
	}
	if producerGroup != "" {
		hb.ProducerDataSet = append(hb.ProducerDataSet, protocol.ProducerData{GroupName: producerGroup})
	}
	body, err := hb.Encode()
	if err != nil {
		t.Fatal(err)
	}
	req := protocol.NewRequest(protocol.ReqHeartbeat)
	req.Body = body
	return c.invoke(t, req)
}

func (c *subClient) consumerList(t testing.TB, group string) (*protocol.Command, []string) {
	t.Helper()
	req := protocol.NewRequest(protocol.ReqGetConsumerListByGroup)
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: group}
	h.Encode(req)
	resp := c.invoke(t, req)
	if resp.Code != protocol.ResSuccess {
		return resp, nil
	}
	var body protocol.GetConsumerListByGroupResponseBody
	if err := body.Decode(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp, body.ConsumerIDList
}

// send sends one message with SEND_MESSAGE (10) and returns the response.
func (c *subClient) send(t testing.TB, code int32, topic string, queue int32, body string, props map[string]string, reconsume, maxReconsume int32) *protocol.Command {
	t.Helper()
	req := protocol.NewRequest(code)
	h := protocol.SendMessageRequestHeader{
		ProducerGroup: "pg", Topic: topic, DefaultTopic: "TBW102", DefaultTopicQueueNums: 4,
		QueueID: queue, BornTimestamp: time.Now().UnixMilli(),
		Properties:        string(protocol.AppendProperties(nil, props)),
		ReconsumeTimes:    protocol.Some(reconsume),
		MaxReconsumeTimes: protocol.Some(maxReconsume),
		UnitMode:          protocol.Some(false),
		Batch:             protocol.Some(false),
	}
	h.Encode(req)
	req.Body = []byte(body)
	return c.invoke(t, req)
}

// subMessages returns copies of every message stored in topic/queue.
func subMessages(t testing.TB, b *Broker, topic string, queue int32) []protocol.MessageExt {
	t.Helper()
	var out []protocol.MessageExt
	_, err := b.store.Get(topic, queue, 0, 1<<16, 0, func(rec []byte, _ int64) bool {
		m, _, err := protocol.DecodeRecord(rec)
		if err != nil {
			t.Errorf("decode %s/%d: %v", topic, queue, err)
			return false
		}
		out = append(out, m.Clone())
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// subEventually polls cond every 10 ms until it returns nil or the
// deadline passes.
func subEventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	poll.Until(t, within, 10*time.Millisecond, cond)
}

// subWaitHolds waits up to 5 s until topic's queue holds exactly want
// messages.
func subWaitHolds(t testing.TB, b *Broker, topic string, queue int32, want int) {
	t.Helper()
	subEventually(t, 5*time.Second, func() error {
		if n := len(subMessages(t, b, topic, queue)); n != want {
			return fmt.Errorf("%s/%d holds %d messages, want %d", topic, queue, n, want)
		}
		return nil
	})
}

// subNever checks that cond stays false for the whole duration.
func subNever(t testing.TB, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			t.Fatalf("%s happened too early", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countNotifies(c *subClient, group string) int {
	n := 0
	for _, r := range c.requests(protocol.ReqNotifyConsumerIDsChanged) {
		if g, _ := r.Ext("consumerGroup"); g == group && r.IsOneway() {
			n++
		}
	}
	return n
}

// ---- tests ----

func TestBrokerClientsHeartbeatRegisters(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	c := subDial(t, b, "10.0.0.5@1")

	// A Go client's heartbeat, verbatim form: codeSet as strings,
	// subVersion in nanoseconds (beyond float64 precision).
	raw := `{"clientID":"10.0.0.5@1","producerDataSet":[{"groupName":"pg"}],"consumerDataSet":[{"groupName":"cg",` +
		`"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",` +
		`"subscriptionDataSet":[{"classFilterMode":false,"topic":"TopicTest","subString":"TagA || TagB",` +
		`"tagsSet":["TagA","TagB"],"codeSet":["2598919","2598920"],"subVersion":1700000000000000001,"expressionType":"TAG"},` +
		`{"classFilterMode":false,"topic":"%RETRY%cg","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1700000000000000002,` +
		`"expressionType":"TAG"}],"unitMode":false}]}`
	req := protocol.NewRequest(protocol.ReqHeartbeat)
	req.Body = []byte(raw)
	resp := c.invoke(t, req)
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: code %d %q", resp.Code, resp.Remark)
	}
	for _, k := range []string{"IS_SUPPORT_HEART_BEAT_V2", "IS_SUB_CHANGE"} {
		if v, _ := resp.Ext(k); v != "true" {
			t.Errorf("response ext %s = %q, want true", k, v)
		}
	}
	tc, ok := b.topicConfig("%RETRY%cg")
	if !ok || tc.ReadQueueNums != 1 || tc.WriteQueueNums != 1 || tc.Perm != protocol.PermRead|protocol.PermWrite {
		t.Errorf("retry topic = %+v, %v; want 1 queue, perm 6", tc, ok)
	}
	if gc, ok := b.groupConfig("cg", false); !ok || gc.RetryMaxTimes != 16 {
		t.Errorf("group config = %+v, %v; want auto-created with retryMaxTimes 16", gc, ok)
	}
	sub, ok := b.ext.subscription("cg", "TopicTest")
	if !ok {
		t.Fatal("no subscription registered for cg/TopicTest")
	}
	if sub.Expression != "TagA || TagB" || sub.ExpressionType != "TAG" || sub.SubVersion != 1700000000000000001 ||
		!slices.Equal(sub.Tags, []string{"TagA", "TagB"}) || !slices.Equal(sub.TagCodes, []int64{2598919, 2598920}) {
		t.Errorf("subscription = %+v", sub)
	}
	if _, ok := b.ext.subscription("cg", "Other"); ok {
		t.Error("subscription for an unsubscribed topic")
	}

	// Java form: codeSet as numbers; a newer subVersion replaces, an older
	// one does not.
	raw2 := `{"clientID":"10.0.0.5@1","consumerDataSet":[{"groupName":"cg","consumeType":"CONSUME_PASSIVELY",` +
		`"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[` +
		`{"topic":"TopicTest","subString":"TagC","tagsSet":["TagC"],"codeSet":[2598921],"subVersion":%d,"expressionType":"TAG"}]}]}`
	for _, v := range []int64{1700000000000000000, 1700000000000000009} {
		req = protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = fmt.Appendf(nil, raw2, v)
		if resp := c.invoke(t, req); resp.Code != protocol.ResSuccess {
			t.Fatalf("heartbeat: %d %q", resp.Code, resp.Remark)
		}
		sub, _ = b.ext.subscription("cg", "TopicTest")
		want := "TagA || TagB"
		if v == 1700000000000000009 {
			want = "TagC"
		}
		if sub.Expression != want {
			t.Errorf("after subVersion %d: expression %q, want %q", v, sub.Expression, want)
		}
	}
	if _, ok := b.ext.subscription("cg", "%RETRY%cg"); ok {
		t.Error("subscription dropped from the heartbeat is still registered")
	}
	// A Java "heartbeat v2" without subscriptions keeps them.
	req = protocol.NewRequest(protocol.ReqHeartbeat)
	req.Body = []byte(`{"clientID":"10.0.0.5@1","heartbeatFingerprint":7,"withoutSub":true,"consumerDataSet":[{"groupName":"cg",` +
		`"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","subscriptionDataSet":[]}]}`)
	if resp := c.invoke(t, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat v2: %d %q", resp.Code, resp.Remark)
	}
	if sub, ok := b.ext.subscription("cg", "TopicTest"); !ok || sub.Expression != "TagC" {
		t.Errorf("after a heartbeat without subscriptions: %+v %v", sub, ok)
	}

	_, ids := c.consumerList(t, "cg")
	if !slices.Equal(ids, []string{"10.0.0.5@1"}) {
		t.Errorf("consumer list = %v", ids)
	}
	if got := b.ext.subscription; got == nil {
		t.Fatal("subscription extension not installed")
	}

	// Bad bodies are rejected without registering anything.
	for _, body := range []string{"", "{", `{"clientID":""}`, `{"clientID":"x","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"codeSet":["x"]}]}]}`} {
		req = protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = []byte(body)
		if resp := c.invoke(t, req); resp.Code != protocol.ResSystemError {
			t.Errorf("heartbeat %q: code %d, want SYSTEM_ERROR", body, resp.Code)
		}
	}
}

func TestBrokerClientsConsumerListAndNotify(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	c1 := subDial(t, b, "client-1")
	c2 := subDial(t, b, "client-2")

	if resp, _ := c1.consumerList(t, "g"); resp.Code != protocol.ResSystemError || resp.Remark != "no consumer for this group, g" {
		t.Errorf("empty group: code %d remark %q", resp.Code, resp.Remark)
	}
	c2.heartbeat(t, "g", "", "T")
	c1.heartbeat(t, "g", "", "T")
	// Heartbeat again: no change, no notification.
	c1.heartbeat(t, "g", "", "T")
	_, ids := c1.consumerList(t, "g")
	if !slices.Equal(ids, []string{"client-1", "client-2"}) {
		t.Fatalf("consumer list = %v", ids)
	}
	// c2 is told about c1 joining (and itself); c1 about itself.
	subEventually(t, 5*time.Second, func() error {
		if n := countNotifies(c2, "g"); n != 2 {
			return fmt.Errorf("c2 got %d notifications, want 2", n)
		}
		if n := countNotifies(c1, "g"); n != 1 {
			return fmt.Errorf("c1 got %d notifications, want 1", n)
		}
		return nil
	})

	// c2 disconnects: c1 is notified and the list shrinks.
	_ = c2.Close()
	subEventually(t, 5*time.Second, func() error {
		if n := countNotifies(c1, "g"); n != 2 {
			return fmt.Errorf("c1 got %d notifications, want 2", n)
		}
		if _, ids := c1.consumerList(t, "g"); !slices.Equal(ids, []string{"client-1"}) {
			return fmt.Errorf("consumer list = %v", ids)
		}
		return nil
	})

	// c3 joins and unregisters: c1 is notified both times.
	c3 := subDial(t, b, "client-3")
	c3.heartbeat(t, "g", "pg3", "T")
	subEventually(t, 5*time.Second, func() error {
		if n := countNotifies(c1, "g"); n != 3 {
			return fmt.Errorf("c1 got %d notifications, want 3", n)
		}
		return nil
	})
	req := protocol.NewRequest(protocol.ReqUnregisterClient)
	uh := protocol.UnregisterClientRequestHeader{ClientID: "client-3", ConsumerGroup: "g", ProducerGroup: "pg3"}
	uh.Encode(req)
	if resp := c3.invoke(t, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("unregister: %d %q", resp.Code, resp.Remark)
	}
	if _, ids := c1.consumerList(t, "g"); !slices.Equal(ids, []string{"client-1"}) {
		t.Errorf("after unregister: consumer list = %v", ids)
	}
	subEventually(t, 5*time.Second, func() error {
		if n := countNotifies(c1, "g"); n != 4 {
			return fmt.Errorf("c1 got %d notifications, want 4", n)
		}
		return nil
	})

	// Connection lists (admin).
	req = protocol.NewRequest(protocol.ReqGetConsumerConnectionList)
	ch := protocol.GetConsumerConnectionListRequestHeader{ConsumerGroup: "g"}
	ch.Encode(req)
	resp := c1.invoke(t, req)
	var cc struct {
		ConnectionSet []struct {
			ClientID string `json:"clientId"`
			Language string `json:"language"`
			Version  int32  `json:"version"`
		} `json:"connectionSet"`
		MessageModel      string                     `json:"messageModel"`
		SubscriptionTable map[string]json.RawMessage `json:"subscriptionTable"`
	}
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("consumer connections: %d %q", resp.Code, resp.Remark)
	}
	if err := json.Unmarshal(resp.Body, &cc); err != nil {
		t.Fatal(err)
	}
	if len(cc.ConnectionSet) != 1 || cc.ConnectionSet[0].ClientID != "client-1" || cc.ConnectionSet[0].Language != "GO" ||
		cc.ConnectionSet[0].Version != 317 || cc.MessageModel != "CLUSTERING" || cc.SubscriptionTable["T"] == nil {
		t.Errorf("consumer connections = %s", resp.Body)
	}
	req = protocol.NewRequest(protocol.ReqGetProducerConnectionList)
	ph := protocol.GetProducerConnectionListRequestHeader{ProducerGroup: "pg3"}
	ph.Encode(req)
	if resp := c1.invoke(t, req); resp.Code != protocol.ResSystemError {
		t.Errorf("unregistered producer group: code %d", resp.Code)
	}
}

func TestBrokerClientsBroadcastingNotNotified(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	c1 := subDial(t, b, "client-1")
	c2 := subDial(t, b, "client-2")
	hb := func(c *subClient) {
		body := `{"clientID":"` + c.id + `","consumerDataSet":[{"groupName":"bg","consumeType":"CONSUME_PASSIVELY",` +
			`"messageModel":"BROADCASTING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[]}]}`
		req := protocol.NewRequest(protocol.ReqHeartbeat)
		req.Body = []byte(body)
		if resp := c.invoke(t, req); resp.Code != protocol.ResSuccess {
			t.Fatalf("heartbeat: %d", resp.Code)
		}
	}
	hb(c1)
	hb(c2)
	_ = c2.Close()
	subEventually(t, 5*time.Second, func() error {
		if _, ids := c1.consumerList(t, "bg"); !slices.Equal(ids, []string{"client-1"}) {
			return fmt.Errorf("list = %v", ids)
		}
		return nil
	})
	// Give a wrongly sent notification time to arrive.
	subNever(t, 200*time.Millisecond, func() bool { return countNotifies(c1, "bg") > 0 }, "broadcasting notification")
}

func TestBrokerClientsExpiry(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c1 := subDial(t, b, "client-1")
	c2 := subDial(t, b, "client-2")
	c1.heartbeat(t, "g", "", "T")
	c2.heartbeat(t, "g", "pg", "T")
	if sc := b.ext; sc.subscription == nil {
		t.Fatal("no extensions")
	}
	clk.advance(100 * time.Second)
	c1.heartbeat(t, "g", "", "T") // c1 stays alive, c2 goes silent
	before := countNotifies(c1, "g")
	clk.advance(30 * time.Second) // c2 silent for 130 s > 120 s; c1 for 30 s
	subEventually(t, 5*time.Second, func() error {
		if _, ids := c1.consumerList(t, "g"); !slices.Equal(ids, []string{"client-1"}) {
			return fmt.Errorf("consumer list = %v", ids)
		}
		if n := countNotifies(c1, "g"); n <= before {
			return fmt.Errorf("c1 not notified of the expiry")
		}
		return nil
	})
	// The expired connection was closed by the broker.
	select {
	case <-c2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("expired client connection still open")
	}
	req := protocol.NewRequest(protocol.ReqGetProducerConnectionList)
	ph := protocol.GetProducerConnectionListRequestHeader{ProducerGroup: "pg"}
	ph.Encode(req)
	if resp := c1.invoke(t, req); resp.Code != protocol.ResSystemError {
		t.Errorf("expired producer group still listed: code %d", resp.Code)
	}
}

func BenchmarkSubscriptionLookup(b *testing.B) {
	clk := &subClock{}
	br := subBroker(b, b.TempDir(), clk)
	r := newClientRegistry(br, &subsystemConfig{channelExpiry: time.Minute, channelScan: time.Second, housekeepTick: time.Second})
	cd := protocol.ConsumerData{GroupName: "g", MessageModel: protocol.MessageModelClustering,
		SubscriptionDataSet: []protocol.SubscriptionData{protocol.NewTagSubscription("T", "a || b", 1)}}
	r.registerConsumer(nil, "c", protocol.LanguageGo, 317, &cd, false)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, ok := r.subscription("g", "T"); !ok {
			b.Fatal("missing")
		}
	}
}
