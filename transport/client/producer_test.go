package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// pullAll drains q from offset until no new message, returning messages
// cloned out of the response buffers.
func pullAll(t testing.TB, c *Client, q protocol.MessageQueue, from int64, expr string) []protocol.MessageExt {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	var out []protocol.MessageExt
	off := from
	for {
		r, err := c.Pull(ctx, PullRequest{Queue: q, Offset: off, Group: "test-reader", Expression: expr, MaxMsgs: 64})
		if err != nil {
			t.Fatal(err)
		}
		for i := range r.Messages {
			out = append(out, r.Messages[i].Clone())
		}
		if r.Status == PullNoNewMsg || r.Status == PullOffsetIllegal {
			return out
		}
		off = r.NextBeginOffset
	}
}

func newProducer(t testing.TB, c *Client, group string, opts ...ProducerOption) *Producer {
	t.Helper()
	p, err := NewProducer(c, group, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestProducerSyncAsyncOnewayBatch(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	qs := e.createTopic(c, "ProdT", 2)
	p := newProducer(t, c, "pg")
	ctx := testCtx(t, 20*time.Second)

	// Sync, with every kind of property.
	m := &Message{Topic: "ProdT", Body: []byte("sync"), Tags: "TagA", Keys: []string{"k1", "k2"},
		Properties: map[string]string{"color": "blue"}, ShardingKey: "s1", Flag: 7}
	res, err := p.Send(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != SendOK || len(res.MsgID) != 32 || len(res.OffsetMsgID) != 32 || res.Queue.Topic != "ProdT" ||
		res.RegionID == "" || res.BrokerAddr != e.brokers["broker-a"].addr {
		t.Fatalf("result %+v", res)
	}
	got := pullAll(t, c, res.Queue, res.QueueOffset, "")
	if len(got) != 1 {
		t.Fatalf("pulled %d messages", len(got))
	}
	g := got[0]
	if string(g.Body) != "sync" || g.Tags() != "TagA" || g.Keys() != "k1 k2" || g.Flag != 7 || g.UniqKey() != res.MsgID ||
		g.OffsetMsgID() != res.OffsetMsgID || g.QueueOffset != res.QueueOffset {
		t.Fatalf("pulled %+v (props %q)", g, g.Properties)
	}
	if v, _ := g.Property("color"); v != "blue" {
		t.Fatalf("user property lost: %q", g.Properties)
	}
	// The sharding key travels under Java's name and under the one the
	// official Go consumer reads.
	for _, name := range []string{protocol.PropShardingKeyJava, protocol.PropShardingKey} {
		if v, _ := g.Property(name); v != "s1" {
			t.Fatalf("sharding key lost under %s: %q", name, g.Properties)
		}
	}

	// Async: 50 in flight, each callback exactly once.
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[string]bool{}
	for i := range 50 {
		wg.Add(1)
		p.SendAsync(ctx, func(r SendResult, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("async %d: %v", i, err)
				return
			}
			ids[r.MsgID] = true
		}, &Message{Topic: "ProdT", Body: fmt.Appendf(nil, "async-%d", i)})
	}
	wg.Wait()
	if len(ids) != 50 {
		t.Fatalf("%d distinct async results", len(ids))
	}
	// Oneway: no answer, but the messages arrive.
	for i := range 5 {
		if err := p.SendOneway(ctx, &Message{Topic: "ProdT", Body: fmt.Appendf(nil, "oneway-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Batch: one request, consecutive offsets, ids in order.
	batch := []*Message{{Topic: "ProdT", Body: []byte("b0"), Tags: "x"}, {Topic: "ProdT", Body: []byte("b1")}, {Topic: "ProdT", Body: []byte("b2"), Keys: []string{"bk"}}}
	br, err := p.Send(ctx, batch...)
	if err != nil {
		t.Fatal(err)
	}
	bids := strings.Split(br.MsgID, ",")
	if len(bids) != 3 {
		t.Fatalf("batch ids %q", br.MsgID)
	}
	bgot := pullAll(t, c, br.Queue, br.QueueOffset, "")
	if len(bgot) < 3 {
		t.Fatalf("batch pulled %d", len(bgot))
	}
	for i := range 3 {
		if string(bgot[i].Body) != fmt.Sprintf("b%d", i) || bgot[i].UniqKey() != bids[i] || bgot[i].QueueOffset != br.QueueOffset+int64(i) {
			t.Fatalf("batch item %d: %+v", i, bgot[i])
		}
	}
	// Everything is there, in total.
	waitFor(t, 5*time.Second, func() error {
		total := 0
		for _, q := range qs {
			total += len(pullAll(t, c, q, 0, ""))
		}
		if want := 1 + 50 + 5 + 3; total != want {
			return fmt.Errorf("%d messages stored, want %d", total, want)
		}
		return nil
	})
}

func TestProducerSelectorsAndQueueOverride(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	qs := e.createTopic(c, "SelT", 4)
	ctx := testCtx(t, 20*time.Second)

	hp := newProducer(t, c, "pg-hash", WithSelector(HashBySharding()))
	byKey := map[string]protocol.MessageQueue{}
	for i := range 40 {
		key := fmt.Sprint("order-", i%5)
		r, err := hp.Send(ctx, &Message{Topic: "SelT", Body: []byte(key), ShardingKey: key})
		if err != nil {
			t.Fatal(err)
		}
		if q, ok := byKey[key]; ok && q != r.Queue {
			t.Fatalf("key %s went to %s and %s", key, q, r.Queue)
		}
		byKey[key] = r.Queue
	}
	rp := newProducer(t, c, "pg-rr")
	seen := map[protocol.MessageQueue]bool{}
	for range 8 {
		r, err := rp.Send(ctx, &Message{Topic: "SelT", Body: []byte("rr")})
		if err != nil {
			t.Fatal(err)
		}
		seen[r.Queue] = true
	}
	if len(seen) != len(qs) {
		t.Fatalf("round robin used %d of %d queues", len(seen), len(qs))
	}
	fp := newProducer(t, c, "pg-func", WithSelector(SelectorFunc(func(_ *Message, q []protocol.MessageQueue) protocol.MessageQueue { return q[2] })))
	if r, err := fp.Send(ctx, &Message{Topic: "SelT", Body: []byte("f")}); err != nil || r.Queue != qs[2] {
		t.Fatalf("func selector: %v %s", err, r.Queue)
	}
	target := qs[3]
	if r, err := rp.Send(ctx, &Message{Topic: "SelT", Body: []byte("o"), Queue: &target}); err != nil || r.Queue != target {
		t.Fatalf("queue override: %v %s", err, r.Queue)
	}
}

func TestProducerCompressionRoundTrip(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	e.createTopic(c, "ZipT", 1)
	p := newProducer(t, c, "pg")
	ctx := testCtx(t, 10*time.Second)
	body := bytes.Repeat([]byte("compressible runnel body "), 800) // 20 KB
	// The encoded request really is compressed.
	var ob outbound
	if err := p.prepare(&ob, []*Message{{Topic: "ZipT", Body: body}}, false); err != nil {
		t.Fatal(err)
	}
	if ob.sysFlag&protocol.SysFlagCompressed == 0 || len(ob.body) >= len(body)/4 {
		t.Fatalf("prepared body %d bytes, sysFlag %#x", len(ob.body), ob.sysFlag)
	}
	p.release(&ob)
	res, err := p.Send(ctx, &Message{Topic: "ZipT", Body: body})
	if err != nil {
		t.Fatal(err)
	}
	// The broker stored the compressed bytes (raw pull body is small).
	req := protocol.NewRequest(protocol.ReqPullMessage)
	h := protocol.PullMessageRequestHeader{ConsumerGroup: "raw", Topic: "ZipT", QueueID: res.Queue.QueueID, QueueOffset: res.QueueOffset,
		MaxMsgNums: 1, SysFlag: protocol.PullFlagSubscription, Subscription: "*", ExpressionType: "TAG"}
	h.Encode(req)
	raw, err := c.invoke(ctx, res.BrokerAddr, req)
	if err != nil || raw.Code != 0 || len(raw.Body) > len(body)/4 {
		t.Fatalf("raw pull: %v code %d, %d bytes", err, raw.Code, len(raw.Body))
	}
	got := pullAll(t, c, res.Queue, res.QueueOffset, "")
	if len(got) != 1 || !bytes.Equal(got[0].Body, body) || got[0].Compressed() {
		t.Fatalf("round trip: %d messages", len(got))
	}
	// Small bodies are not compressed; compression can be turned off.
	np := newProducer(t, c, "pg-nozip", WithCompression(0, 0))
	if err := np.prepare(&ob, []*Message{{Topic: "ZipT", Body: body}}, false); err != nil || ob.sysFlag&protocol.SysFlagCompressed != 0 {
		t.Fatalf("compression off: %v %#x", err, ob.sysFlag)
	}
	np.release(&ob)
}

func TestProducerDelayLevel(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	e.createTopic(c, "DelayT", 1)
	p := newProducer(t, c, "pg")
	ctx := testCtx(t, 20*time.Second)
	sent := time.Now()
	res, err := p.Send(ctx, &Message{Topic: "DelayT", Body: []byte("later"), DelayLevel: 1}) // 1 s
	if err != nil {
		t.Fatal(err)
	}
	q := protocol.MessageQueue{Topic: "DelayT", BrokerName: res.Queue.BrokerName, QueueID: 0}
	if got := pullAll(t, c, q, 0, ""); len(got) != 0 {
		t.Fatalf("delayed message visible at once: %d", len(got))
	}
	var got []protocol.MessageExt
	waitFor(t, 10*time.Second, func() error {
		if got = pullAll(t, c, q, 0, ""); len(got) == 0 {
			return errors.New("not delivered yet")
		}
		return nil
	})
	if el := time.Since(sent); el < 900*time.Millisecond {
		t.Fatalf("delivered after %v, want about 1s", el)
	}
	if string(got[0].Body) != "later" || got[0].UniqKey() != res.MsgID {
		t.Fatalf("delivered %+v", got[0])
	}
}

// TestProducerFailover runs two brokers: with one shut down, sends go to
// the other; when it comes back, it gets messages again and its queue is
// readable.
func TestProducerFailover(t *testing.T) {
	e := newCoreEnv(t, "broker-a", "broker-b")
	c := e.client(WithRouteRefreshInterval(100*time.Millisecond), WithRequestTimeout(2*time.Second))
	e.createTopic(c, "FailT", 2)
	p := newProducer(t, c, "pg",
		WithFaultTables([]time.Duration{0, 550 * time.Millisecond, 3 * time.Second}, []time.Duration{0, 300 * time.Millisecond, 300 * time.Millisecond}))
	ctx := testCtx(t, 30*time.Second)
	count := func(n int) map[string]int {
		t.Helper()
		per := map[string]int{}
		for i := range n {
			r, err := p.Send(ctx, &Message{Topic: "FailT", Body: fmt.Appendf(nil, "m%d", i)})
			if err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
			per[r.Queue.BrokerName]++
		}
		return per
	}
	if per := count(8); per["broker-a"] == 0 || per["broker-b"] == 0 {
		t.Fatalf("both brokers up: %v", per)
	}
	aQueue := protocol.MessageQueue{Topic: "FailT", BrokerName: "broker-a", QueueID: 0}
	before := len(pullAll(t, c, aQueue, 0, ""))

	e.stopBroker("broker-a")
	// Every send succeeds (retries go to broker-b) while broker-a is down.
	if per := count(20); per["broker-b"] != 20 {
		t.Fatalf("with broker-a down: %v", per)
	}
	e.restartBroker("broker-a")
	waitFor(t, 15*time.Second, func() error {
		if per := count(4); per["broker-a"] == 0 {
			return fmt.Errorf("broker-a gets nothing yet: %v", per)
		}
		return nil
	})
	// Pulls from broker-a resume, with the messages stored before the loss.
	if after := len(pullAll(t, c, aQueue, 0, "")); after < before {
		t.Fatalf("broker-a queue 0 had %d messages, now %d", before, after)
	}
}

// TestProducerMaybeApplied uses a server that accepts sends and never
// answers: the send times out after writing, so the outcome is unknown.
func TestProducerMaybeApplied(t *testing.T) {
	e := newCoreEnv(t)
	srv, err := remoting.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 20*time.Second)
	addr, err := srv.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Handle(protocol.ReqGetRouteInfoByTopic, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		d := protocol.TopicRouteData{
			QueueDatas:  []protocol.QueueData{{BrokerName: "silent", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}},
			BrokerDatas: []protocol.BrokerData{{Cluster: "c", BrokerName: "silent", BrokerAddrs: map[int64]string{0: addr.String()}}},
		}
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.Body, _ = d.Encode()
		return resp, nil
	}))
	srv.Handle(protocol.ReqSendMessageV2, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		rc.Defer() // never answered
		return nil, nil
	}))
	c := e.client(WithNameServers(addr.String()))
	p := newProducer(t, c, "pg", WithRetries(0))
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = p.Send(sctx, &Message{Topic: "T", Body: []byte("x")})
	if !errors.Is(err, remoting.ErrTimeout) || !MaybeApplied(err) {
		t.Fatalf("silent broker: %v (MaybeApplied %v)", err, MaybeApplied(err))
	}
	// With retries, an unsure first attempt keeps the final error unsure.
	// Each attempt ends at the send timeout (enforced by the connection's
	// timer, the ctx having no deadline that early).
	p2 := newProducer(t, c, "pg2", WithRetries(1), WithSendTimeout(200*time.Millisecond))
	start := time.Now()
	if _, err := p2.Send(ctx, &Message{Topic: "T", Body: []byte("x")}); !MaybeApplied(err) || !errors.Is(err, remoting.ErrTimeout) {
		t.Fatalf("retried silent broker: %v", err)
	}
	if el := time.Since(start); el < 400*time.Millisecond || el > 3*time.Second {
		t.Fatalf("two attempts of 200ms took %v", el)
	}
	// Refused connection: surely not applied.
	dead := deadAddr(t)
	srv.Handle(protocol.ReqGetRouteInfoByTopic, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		d := protocol.TopicRouteData{
			QueueDatas:  []protocol.QueueData{{BrokerName: "dead", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}},
			BrokerDatas: []protocol.BrokerData{{Cluster: "c", BrokerName: "dead", BrokerAddrs: map[int64]string{0: dead}}},
		}
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.Body, _ = d.Encode()
		return resp, nil
	}))
	_, err = p.Send(ctx, &Message{Topic: "T2", Body: []byte("x")})
	if err == nil || MaybeApplied(err) || !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dead broker: %v (MaybeApplied %v)", err, MaybeApplied(err))
	}
	// A broker reply is not "maybe".
	if MaybeApplied(protocol.ErrMessageIllegal) || MaybeApplied(nil) {
		t.Fatal("MaybeApplied of a reply or nil")
	}
}

func TestProducerTransactions(t *testing.T) {
	e := newCoreEnv(t)
	var checked sync.Map
	c := e.client()
	e.createTopic(c, "TxT", 1)
	p := newProducer(t, c, "tx-group", WithCheckListener(func(_ context.Context, m *protocol.MessageExt) TxState {
		checked.Store(m.UniqKey(), true)
		return TxCommit
	}))
	ctx := testCtx(t, 20*time.Second)
	h, err := p.SendHalf(ctx, &Message{Topic: "TxT", Body: []byte("half")})
	if err != nil {
		t.Fatalf("SendHalf: %v", err)
	}
	if h.MsgID == "" || h.CommitLogOffset < 0 || h.BrokerAddr == "" || h.ProducerGroup != "tx-group" {
		t.Fatalf("handle %+v", h)
	}
	if err := p.EndTransaction(ctx, h, true); err != nil {
		t.Fatal(err)
	}
	q := protocol.MessageQueue{Topic: "TxT", BrokerName: "broker-a", QueueID: 0}
	waitFor(t, 5*time.Second, func() error {
		for _, m := range pullAll(t, c, q, 0, "") {
			if m.UniqKey() == h.MsgID {
				return nil
			}
		}
		return errors.New("committed message not visible")
	})
}

// TestProducerSendHalfWith: the pairs given beside a half message's map
// are stored as its properties (over the map's value for a name in both,
// the map left as it was), through the synchronous and asynchronous sends;
// pairs that are not pairs, name a property the producer sets or cannot
// be carried are refused before anything is sent.
func TestProducerSendHalfWith(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	e.createTopic(c, "TxW", 1)
	p := newProducer(t, c, "tx-with")
	ctx := testCtx(t, 20*time.Second)
	m := &Message{Topic: "TxW", Body: []byte("sync"), Properties: map[string]string{"b": "map", "c": "3"}}
	h1, err := p.SendHalfWith(ctx, m, []string{"a", "1", "b", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Properties) != 2 || m.Properties["b"] != "map" {
		t.Fatalf("the message's map changed: %v", m.Properties)
	}
	got := make(chan TxHandle, 1)
	p.SendHalfAsyncWith(ctx, &Message{Topic: "TxW", Body: []byte("async")}, []string{"a", "x"}, halfFunc(func(h TxHandle, err error) {
		if err != nil {
			t.Error(err)
		}
		got <- h
	}))
	h2 := <-got
	for _, h := range []TxHandle{h1, h2} {
		if err := p.EndTransaction(ctx, h, true); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]map[string]string{
		h1.MsgID: {"a": "1", "b": "2", "c": "3"},
		h2.MsgID: {"a": "x"},
	}
	q := protocol.MessageQueue{Topic: "TxW", BrokerName: "broker-a", QueueID: 0}
	waitFor(t, 5*time.Second, func() error {
		seen := 0
		for _, m := range pullAll(t, c, q, 0, "") {
			w, ok := want[m.UniqKey()]
			if !ok {
				continue
			}
			seen++
			for k, v := range w {
				if got, _ := m.Property(k); got != v {
					t.Fatalf("message %s: property %q = %q, want %q", m.UniqKey(), k, got, v)
				}
			}
		}
		if seen != 2 {
			return fmt.Errorf("%d of 2 committed messages visible", seen)
		}
		return nil
	})
	for _, bad := range [][]string{{"a"}, {protocol.PropTags, "t"}, {protocol.PropProducerGroup, "other"}, {"a", "x\x01y"}, {"", "v"}} {
		if _, err := p.SendHalfWith(ctx, &Message{Topic: "TxW", Body: []byte("bad")}, bad); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("pairs %q: %v, want ErrInvalidMessage", bad, err)
		}
		refused := make(chan error, 1)
		p.SendHalfAsyncWith(ctx, &Message{Topic: "TxW", Body: []byte("bad")}, bad, halfFunc(func(_ TxHandle, err error) { refused <- err }))
		if err := <-refused; !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("pairs %q, async: %v, want ErrInvalidMessage", bad, err)
		}
	}
}

// BenchmarkValidatePairs checks the properties an exactly-once sink's
// scale-out task gives beside each record (SendHalfWith), as every half
// send does.
func BenchmarkValidatePairs(b *testing.B) {
	kv := []string{"runnel.epoch", "1042", "runnel.run", "9f1c2e7a5b3d4c6e", "runnel.task", "keyed-count/r3",
		"runnel.owner", "17", "runnel.slot", "12345", "runnel.try", "1"}
	b.ReportAllocs()
	for b.Loop() {
		if err := validatePairs(kv); err != nil {
			b.Fatal(err)
		}
	}
}
