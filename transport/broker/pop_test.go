package broker

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// popArgs describes a POP_MESSAGE request.
type popArgs struct {
	group, topic   string
	queue          int32
	max            int32
	invisibleMS    int64
	pollMS         int64
	order          bool
	attempt        string
	expType, exp   string
	initModeMaxOff bool
}

func popReq(a popArgs) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqPopMessage)
	h := protocol.PopMessageRequestHeader{ConsumerGroup: a.group, Topic: a.topic, QueueID: a.queue, MaxMsgNums: a.max,
		InvisibleTime: a.invisibleMS, PollTime: a.pollMS, BornTime: time.Now().UnixMilli(), ExpType: a.expType, Exp: a.exp,
		Order: protocol.Some(a.order), AttemptID: a.attempt}
	if a.initModeMaxOff {
		h.InitMode = 1
	}
	h.Encode(req)
	return req
}

// popped is one message of a pop, with the receipt handle a Java client
// would build (MQClientAPIImpl.processPopResponse).
type popped struct {
	m      protocol.MessageExt
	handle protocol.ExtraInfo
	count  int // order count, -1 when none
}

type popResp struct {
	code int32
	h    protocol.PopMessageResponseHeader
	msgs []popped
}

func decodePop(t testing.TB, brokerName string, resp *protocol.Command) popResp {
	t.Helper()
	r := popResp{code: resp.Code}
	if err := r.h.Decode(resp); err != nil {
		t.Fatalf("pop response header (code %d %q): %v", resp.Code, resp.Remark, err)
	}
	if resp.Code != protocol.ResSuccess {
		return r
	}
	start, err := protocol.ParsePopOffsetInfo(r.h.StartOffsetInfo)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := protocol.ParsePopOffsetInfo(r.h.OrderCountInfo)
	if err != nil {
		t.Fatal(err)
	}
	if err := protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool {
		p := popped{m: m.Clone(), count: -1}
		if ck, ok := m.Property(protocol.PropPopCK); ok {
			if p.handle, err = protocol.ParseExtraInfo(ck); err != nil {
				t.Fatal(err)
			}
		} else {
			s := start[protocol.PopInfoKey(m.Topic, m.QueueID)]
			if len(s) != 1 {
				t.Fatalf("no start offset for %s@%d in %q", m.Topic, m.QueueID, r.h.StartOffsetInfo)
			}
			p.handle = protocol.ExtraInfo{CkQueueOffset: s[0], PopTime: r.h.PopTime, InvisibleTime: r.h.InvisibleTime,
				ReviveQID: r.h.ReviveQID, Retry: protocol.PopRetryFlag(m.Topic), BrokerName: brokerName, QueueID: m.QueueID,
				MsgQueueOffset: m.QueueOffset}
		}
		if c, ok := counts[protocol.PopOrderCountKey(m.Topic, m.QueueID, m.QueueOffset)]; ok {
			p.count = int(c[0])
		}
		r.msgs = append(r.msgs, p)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

func popOnce(t testing.TB, c *remoting.Conn, a popArgs) popResp {
	t.Helper()
	return decodePop(t, DefaultBrokerName, invoke(t, c, popReq(a)))
}

// ackReq acks a popped message as a Java client does: the real topic (the
// retry topic for a revived message), the handle's queue and offset.
func ackReq(group, topic string, p popped) *protocol.Command {
	real, _ := protocol.PopRealTopic(topic, group, p.handle.Retry)
	req := protocol.NewRequest(protocol.ReqAckMessage)
	h := protocol.AckMessageRequestHeader{ConsumerGroup: group, Topic: real, QueueID: p.handle.QueueID,
		ExtraInfo: p.handle.String(), Offset: p.handle.MsgQueueOffset}
	h.Encode(req)
	return req
}

func ack(t testing.TB, c *remoting.Conn, group, topic string, p popped) {
	t.Helper()
	if resp := invoke(t, c, ackReq(group, topic, p)); resp.Code != protocol.ResSuccess {
		t.Fatalf("ack %d: %d %q", p.m.QueueOffset, resp.Code, resp.Remark)
	}
}

func popBodies(ps []popped) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p.m.Body)
	}
	sort.Strings(out)
	return out
}

func sendBodies(t testing.TB, c *remoting.Conn, topic string, queue int32, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		send(t, c, topic, queue, []byte(b), props("TAGS", "t"))
	}
}

// TestBrokerPopAckRevive pops every queue of a topic, acks some messages
// and lets the others' invisible time pass: those come back, once, through
// the pop retry topic (%RETRY%G_T) with the topic shown as T, their
// receipt handle in POP_CK and their reconsume count up; acked once more
// they are gone. A second pop before that finds nothing (they are
// invisible), and the group's offset has moved past the popped messages.
func TestBrokerPopAckRevive(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk, WithPopReviveInterval(10*time.Millisecond))
	c := subDial(t, b, "10.0.1.1@1")
	sendBodies(t, c.Conn, "T", 0, "a", "b", "c")
	sendBodies(t, c.Conn, "T", 1, "d", "e")
	r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000})
	if r.code != protocol.ResSuccess || !slices.Equal(popBodies(r.msgs), []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("pop: code %d, %v", r.code, popBodies(r.msgs))
	}
	if r.h.RestNum != 0 || r.h.InvisibleTime != 60000 || r.h.ReviveQID < 0 || r.h.ReviveQID >= 8 {
		t.Errorf("pop header %+v", r.h)
	}
	for _, p := range r.msgs {
		if b := string(p.m.Body); b == "a" || b == "c" || b == "e" {
			ack(t, c.Conn, "G", "T", p)
		}
	}
	if again := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000}); again.code != protocol.ResPollingTimeout {
		t.Errorf("second pop: code %d %v, want POLLING_TIMEOUT (nothing visible)", again.code, popBodies(again.msgs))
	}
	for q, want := range map[int32]int64{0: 3, 1: 2} {
		if off, ok, _ := b.store.QueryOffset("G", "T", q); !ok || off != want {
			t.Errorf("group offset of queue %d: %d %v, want %d", q, off, ok, want)
		}
	}

	clk.advance(2 * time.Minute) // past the invisible time: revive
	var back []popped
	waitFor(t, 10*time.Second, "the revived messages", func() bool {
		r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000})
		back = append(back, r.msgs...)
		return len(back) >= 2
	})
	if !slices.Equal(popBodies(back), []string{"b", "d"}) {
		t.Fatalf("revived %v, want b d", popBodies(back))
	}
	for _, p := range back {
		if p.m.Topic != "T" || p.m.ReconsumeTimes != 1 || p.handle.Retry != protocol.PopRetryV1 {
			t.Errorf("revived %q: topic %s reconsume %d handle %+v", p.m.Body, p.m.Topic, p.m.ReconsumeTimes, p.handle)
		}
		if v, _ := p.m.Property(protocol.PropFirstPopTime); v == "" {
			t.Errorf("revived %q has no 1ST_POP_TIME", p.m.Body)
		}
		ack(t, c.Conn, "G", "T", p)
	}
	clk.advance(2 * time.Minute)
	waitRevived(t, b)
	if r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000}); r.code != protocol.ResPollingTimeout {
		t.Errorf("after acking the revived: code %d %v", r.code, popBodies(r.msgs))
	}
	if _, ok := b.topics.get(protocol.PopRetryTopicV1("T", "G")); !ok {
		t.Error("no pop retry topic")
	}
}

// TestBrokerPopChangeInvisible extends one message's invisible time with
// CHANGE_MESSAGE_INVISIBLETIME: it is not revived at the old deadline, is
// at the new one, and the new handle acks it.
func TestBrokerPopChangeInvisible(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk, WithPopReviveInterval(10*time.Millisecond))
	c := subDial(t, b, "10.0.1.2@1")
	sendBodies(t, c.Conn, "T", 0, "x", "y")
	r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 32, invisibleMS: 10000})
	if len(r.msgs) != 2 {
		t.Fatalf("pop: %v", popBodies(r.msgs))
	}
	x := r.msgs[0]
	req := protocol.NewRequest(protocol.ReqChangeMessageInvisibleTime)
	(&protocol.ChangeInvisibleTimeRequestHeader{ConsumerGroup: "G", Topic: "T", QueueID: 0, ExtraInfo: x.handle.String(),
		Offset: x.m.QueueOffset, InvisibleTime: 600000}).Encode(req)
	resp := invoke(t, c.Conn, req)
	var rh protocol.ChangeInvisibleTimeResponseHeader
	if resp.Code != protocol.ResSuccess || rh.Decode(resp) != nil || rh.InvisibleTime != 600000 {
		t.Fatalf("change: %d %q %+v", resp.Code, resp.Remark, rh)
	}
	ack(t, c.Conn, "G", "T", r.msgs[1])
	clk.advance(time.Minute) // past 10 s, not 10 min
	waitRevived(t, b)
	if r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 10000}); r.code != protocol.ResPollingTimeout {
		t.Fatalf("at the old deadline: %d %v", r.code, popBodies(r.msgs))
	}
	clk.advance(10 * time.Minute)
	var back []popped
	waitFor(t, 10*time.Second, "the revive at the new deadline", func() bool {
		back = append(back, popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 10000}).msgs...)
		return len(back) > 0
	})
	if len(back) != 1 || string(back[0].m.Body) != "x" {
		t.Fatalf("revived %v, want x", popBodies(back))
	}
	// The new handle (as the client builds it from the response) acks x.
	nh := x
	nh.handle = protocol.ExtraInfo{CkQueueOffset: x.m.QueueOffset, PopTime: rh.PopTime, InvisibleTime: rh.InvisibleTime,
		ReviveQID: rh.ReviveQID, Retry: protocol.PopNormalTopic, BrokerName: DefaultBrokerName, QueueID: 0, MsgQueueOffset: x.m.QueueOffset}
	ack(t, c.Conn, "G", "T", nh)
	if resp := invoke(t, c.Conn, req); resp.Code != protocol.ResSuccess {
		t.Errorf("changing an already revived message: %d %q", resp.Code, resp.Remark)
	}
	badOff := protocol.NewRequest(protocol.ReqChangeMessageInvisibleTime)
	(&protocol.ChangeInvisibleTimeRequestHeader{ConsumerGroup: "G", Topic: "T", QueueID: 0, ExtraInfo: x.handle.String(),
		Offset: 2, InvisibleTime: 1000}).Encode(badOff)
	if resp := invoke(t, c.Conn, badOff); resp.Code != protocol.ResNoMessage {
		t.Errorf("change at the max offset: %d, want NO_MESSAGE", resp.Code)
	}
}

// TestBrokerPopOrderly pops a queue orderly: while the batch is unacked
// and invisible the queue is blocked (other pops get nothing of it, the
// same attempt id gets the batch again); after its invisible time the same
// messages come again in order with their count in orderCountInfo; acks
// move the group's offset and unblock the queue.
func TestBrokerPopOrderly(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "10.0.1.3@1")
	sendBodies(t, c.Conn, "T", 0, "1", "2", "3", "4")
	first := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 2, invisibleMS: 5000, order: true, attempt: "a1"})
	if got := popBodies(first.msgs); !slices.Equal(got, []string{"1", "2"}) || first.h.ReviveQID != protocol.PopOrderReviveQueue {
		t.Fatalf("first orderly pop: %v revive %d", got, first.h.ReviveQID)
	}
	if r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 2, invisibleMS: 5000, order: true, attempt: "a2"}); r.code != protocol.ResPollingTimeout {
		t.Errorf("blocked queue popped: %v", popBodies(r.msgs))
	}
	if r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 2, invisibleMS: 5000, order: true, attempt: "a1"}); !slices.Equal(popBodies(r.msgs), []string{"1", "2"}) {
		t.Errorf("the same attempt again: %v", popBodies(r.msgs))
	}
	clk.advance(10 * time.Second)
	again := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 2, invisibleMS: 5000, order: true, attempt: "a3"})
	if got := popBodies(again.msgs); !slices.Equal(got, []string{"1", "2"}) {
		t.Fatalf("after the invisible time: %v, want 1 2 again", got)
	}
	for _, p := range again.msgs {
		if p.count != 1 {
			t.Errorf("message %s: order count %d, want 1 (orderCountInfo %q)", p.m.Body, p.count, again.h.OrderCountInfo)
		}
	}
	ack(t, c.Conn, "G", "T", again.msgs[0])
	if off, _, _ := b.store.QueryOffset("G", "T", 0); off != 1 {
		t.Errorf("offset after one ack: %d, want 1", off)
	}
	ack(t, c.Conn, "G", "T", again.msgs[1])
	if off, _, _ := b.store.QueryOffset("G", "T", 0); off != 2 {
		t.Errorf("offset after both acks: %d, want 2", off)
	}
	next := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 2, invisibleMS: 5000, order: true, attempt: "a4"})
	if got := popBodies(next.msgs); !slices.Equal(got, []string{"3", "4"}) {
		t.Errorf("after the acks: %v, want 3 4", got)
	}
}

// TestBrokerPopLongPoll parks pops (and a NOTIFICATION) and stores a
// message: they are answered with it (hasMsg); POLLING_INFO counts the
// parked pops; a parked pop whose poll time ends answers POLLING_TIMEOUT.
func TestBrokerPopLongPoll(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{})
	c := subDial(t, b, "10.0.1.4@1")
	send(t, c.Conn, "T", 0, []byte("first"), "") // creates the topic
	popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	popDone := make(chan popResp, 1)
	go func() {
		resp, err := c.Invoke(ctx, popReq(popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000, pollMS: 20000}))
		if err != nil {
			t.Error(err)
			popDone <- popResp{code: -1}
			return
		}
		popDone <- decodePop(t, DefaultBrokerName, resp)
	}()
	noteDone := make(chan bool, 1)
	go func() {
		req := protocol.NewRequest(protocol.ReqNotification)
		(&protocol.NotificationRequestHeader{ConsumerGroup: "G2", Topic: "T", QueueID: 0, PollTime: 20000, BornTime: time.Now().UnixMilli()}).Encode(req)
		resp, err := c.Invoke(ctx, req)
		var rh protocol.NotificationResponseHeader
		if err == nil {
			err = rh.Decode(resp)
		}
		if err != nil {
			t.Error(err)
		}
		noteDone <- rh.HasMsg
	}()
	waitFor(t, 10*time.Second, "the pop to park", func() bool { return b.pop.waiters.n.Load() >= 1 })
	info := protocol.NewRequest(protocol.ReqPollingInfo)
	(&protocol.PollingInfoRequestHeader{ConsumerGroup: "G", Topic: "T", QueueID: -1}).Encode(info)
	resp := invoke(t, c.Conn, info)
	var ih protocol.PollingInfoResponseHeader
	if resp.Code != protocol.ResSuccess || ih.Decode(resp) != nil || ih.PollingNum != 1 {
		t.Errorf("POLLING_INFO: %d %q %+v", resp.Code, resp.Remark, ih)
	}
	send(t, c.Conn, "T", 0, []byte("second"), "")
	r := <-popDone
	if r.code != protocol.ResSuccess || !slices.Equal(popBodies(r.msgs), []string{"second"}) {
		t.Errorf("woken pop: %d %v", r.code, popBodies(r.msgs))
	}
	// G2 has no offset: a NOTIFICATION may answer at once (the message of
	// offset 0 is there) or when woken; either way hasMsg.
	if !<-noteDone {
		t.Error("NOTIFICATION answered no message")
	}
	start := time.Now()
	r = popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000, pollMS: 200})
	if r.code != protocol.ResPollingTimeout || time.Since(start) < 150*time.Millisecond {
		t.Errorf("expired pop: code %d after %v", r.code, time.Since(start))
	}
}

// TestBrokerPopErrors checks the answers to bad POP-family requests, as a
// Java broker gives them.
func TestBrokerPopErrors(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{}, WithAutoCreateGroups(false))
	c := subDial(t, b, "10.0.1.5@1")
	send(t, c.Conn, "T", 0, []byte("x"), "")
	createGroup := protocol.NewRequest(protocol.ReqUpdateAndCreateSubscriptionGroup)
	createGroup.Body = []byte(`{"groupName":"G","consumeEnable":true,"retryQueueNums":1,"retryMaxTimes":16}`)
	if resp := invoke(t, c.Conn, createGroup); resp.Code != protocol.ResSuccess {
		t.Fatalf("create group: %d %q", resp.Code, resp.Remark)
	}
	for _, tc := range []struct {
		name string
		a    popArgs
		code int32
	}{
		{"33 messages", popArgs{group: "G", topic: "T", queue: -1, max: 33, invisibleMS: 1000}, protocol.ResInvalidParameter},
		{"no topic", popArgs{group: "G", topic: "Nope", queue: -1, max: 1, invisibleMS: 1000}, protocol.ResTopicNotExist},
		{"queue beyond", popArgs{group: "G", topic: "T", queue: 99, max: 1, invisibleMS: 1000}, protocol.ResInvalidParameter},
		{"no group", popArgs{group: "Nobody", topic: "T", queue: -1, max: 1, invisibleMS: 1000}, protocol.ResSubscriptionGroupNotExist},
		{"bad SQL", popArgs{group: "G", topic: "T", queue: -1, max: 1, invisibleMS: 1000, expType: "SQL92", exp: "a >"}, protocol.ResSubscriptionParseFailed},
	} {
		if resp := invoke(t, c.Conn, popReq(tc.a)); resp.Code != tc.code {
			t.Errorf("%s: code %d %q, want %d", tc.name, resp.Code, resp.Remark, tc.code)
		}
	}
	good := protocol.ExtraInfo{CkQueueOffset: 0, PopTime: 1, InvisibleTime: 1, ReviveQID: 0, Retry: "0", BrokerName: "b", QueueID: 0, MsgQueueOffset: 0}
	for _, tc := range []struct {
		name  string
		topic string
		queue int32
		off   int64
		extra string
		code  int32
	}{
		{"no topic", "Nope", 0, 0, good.String(), protocol.ResTopicNotExist},
		{"queue beyond", "T", 7, 0, good.String(), protocol.ResMessageIllegal},
		{"offset beyond", "T", 0, 9, good.String(), protocol.ResNoMessage},
		{"bad handle", "T", 0, 0, "1 2 3", protocol.ResSystemError},
		{"unknown checkpoint", "T", 0, 0, good.String(), protocol.ResSuccess},
	} {
		req := protocol.NewRequest(protocol.ReqAckMessage)
		(&protocol.AckMessageRequestHeader{ConsumerGroup: "G", Topic: tc.topic, QueueID: tc.queue, ExtraInfo: tc.extra, Offset: tc.off}).Encode(req)
		if resp := invoke(t, c.Conn, req); resp.Code != tc.code {
			t.Errorf("ack %s: code %d %q, want %d", tc.name, resp.Code, resp.Remark, tc.code)
		}
	}
	empty := protocol.NewRequest(protocol.ReqBatchAckMessage)
	empty.Body = []byte(`{"acks":[]}`)
	if resp := invoke(t, c.Conn, empty); resp.Code != protocol.ResNoMessage {
		t.Errorf("empty batch ack: %d, want NO_MESSAGE", resp.Code)
	}
}

// TestBrokerPopBatchAckAndFilter pops with a TAG and an SQL92 filter and
// acks with BATCH_ACK_MESSAGE (a bit per message, as Java's BatchAck): the
// batch-acked messages are never revived.
func TestBrokerPopBatchAckAndFilter(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk, WithPopReviveInterval(10*time.Millisecond))
	c := subDial(t, b, "10.0.1.6@1")
	for i := range 6 {
		tag := "a"
		if i%2 == 1 {
			tag = "b"
		}
		send(t, c.Conn, "T", 0, []byte(strconv.Itoa(i)), props("TAGS", tag, "n", strconv.Itoa(i)))
	}
	tags := popOnce(t, c.Conn, popArgs{group: "GT", topic: "T", queue: 0, max: 32, invisibleMS: 1000, expType: "TAG", exp: "a"})
	if got := popBodies(tags.msgs); !slices.Equal(got, []string{"0", "2", "4"}) {
		t.Errorf("TAG pop: %v", got)
	}
	sql := popOnce(t, c.Conn, popArgs{group: "GS", topic: "T", queue: 0, max: 32, invisibleMS: 1000, expType: "SQL92", exp: "n >= 3"})
	if got := popBodies(sql.msgs); !slices.Equal(got, []string{"3", "4", "5"}) {
		t.Fatalf("SQL92 pop: %v", got)
	}
	ba := protocol.BatchAck{ConsumerGroup: "GS", Topic: "T", Retry: "0", StartOffset: sql.msgs[0].handle.CkQueueOffset,
		QueueID: 0, ReviveQueueID: sql.h.ReviveQID, PopTime: sql.h.PopTime, InvisibleTime: sql.h.InvisibleTime}
	for _, p := range sql.msgs {
		ba.Bits = append(ba.Bits, int(p.m.QueueOffset-ba.StartOffset))
	}
	body := protocol.BatchAckMessageRequestBody{BrokerName: DefaultBrokerName, Acks: []protocol.BatchAck{ba}}
	req := protocol.NewRequest(protocol.ReqBatchAckMessage)
	var err error
	if req.Body, err = body.Encode(); err != nil {
		t.Fatal(err)
	}
	if resp := invoke(t, c.Conn, req); resp.Code != protocol.ResSuccess {
		t.Fatalf("batch ack: %d %q", resp.Code, resp.Remark)
	}
	clk.advance(time.Minute)
	var tagBack []popped
	waitFor(t, 10*time.Second, "the TAG group's revived messages", func() bool {
		tagBack = append(tagBack, popOnce(t, c.Conn, popArgs{group: "GT", topic: "T", queue: -1, max: 32, invisibleMS: 1000}).msgs...)
		return len(tagBack) >= 3
	})
	waitRevived(t, b)
	if r := popOnce(t, c.Conn, popArgs{group: "GS", topic: "T", queue: -1, max: 32, invisibleMS: 1000}); r.code != protocol.ResPollingTimeout {
		t.Errorf("batch-acked messages came back: %v", popBodies(r.msgs))
	}
}

// TestBrokerQueryAssignment: without a configured mode a group gets its
// queues in PULL mode (averagely among its members); SET_MESSAGE_REQUEST_MODE
// makes it POP with every queue shared (queue id -1), and keeps it across a
// restart; a retry topic's mode cannot be set.
func TestBrokerQueryAssignment(t *testing.T) {
	subLeakCheck(t)
	dir := t.TempDir()
	b := subBroker(t, dir, &subClock{})
	c := subDial(t, b, "10.0.1.7@1")
	c.heartbeat(t, "G", "", "T")
	for q := range int32(4) {
		send(t, c.Conn, "T", q, []byte("x"), "")
	}
	query := func(c *subClient) protocol.QueryAssignmentResponseBody {
		t.Helper()
		req := protocol.NewRequest(protocol.ReqQueryAssignment)
		body := protocol.QueryAssignmentRequestBody{Topic: "T", ConsumerGroup: "G", ClientID: c.id, StrategyName: "AVG",
			MessageModel: protocol.MessageModelClustering}
		req.Body, _ = body.Encode()
		resp := c.invoke(t, req)
		var out protocol.QueryAssignmentResponseBody
		if resp.Code != protocol.ResSuccess || out.Decode(resp.Body) != nil {
			t.Fatalf("QUERY_ASSIGNMENT: %d %q %s", resp.Code, resp.Remark, resp.Body)
		}
		return out
	}
	out := query(c)
	if len(out.MessageQueueAssignments) != 4 || out.MessageQueueAssignments[0].Mode != protocol.RequestModePull {
		t.Fatalf("default assignment: %+v", out)
	}
	set := protocol.NewRequest(protocol.ReqSetMessageRequestMode)
	set.Body, _ = (&protocol.SetMessageRequestModeRequestBody{Topic: "T", ConsumerGroup: "G", Mode: protocol.RequestModePop, PopShareQueueNum: -1}).Encode()
	if resp := c.invoke(t, set); resp.Code != protocol.ResSuccess {
		t.Fatalf("SET_MESSAGE_REQUEST_MODE: %d %q", resp.Code, resp.Remark)
	}
	retry := protocol.NewRequest(protocol.ReqSetMessageRequestMode)
	retry.Body, _ = (&protocol.SetMessageRequestModeRequestBody{Topic: "%RETRY%G", ConsumerGroup: "G", Mode: protocol.RequestModePop}).Encode()
	if resp := c.invoke(t, retry); resp.Code != protocol.ResNoPermission {
		t.Errorf("mode of a retry topic: %d, want NO_PERMISSION", resp.Code)
	}
	check := func(out protocol.QueryAssignmentResponseBody) {
		t.Helper()
		if len(out.MessageQueueAssignments) != 1 {
			t.Fatalf("POP assignment: %+v", out)
		}
		a := out.MessageQueueAssignments[0]
		if a.Mode != protocol.RequestModePop || a.MessageQueue.QueueID != -1 || a.MessageQueue.Topic != "T" {
			t.Errorf("POP assignment %+v", a)
		}
	}
	check(query(c))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := subBroker(t, dir, &subClock{})
	c2 := subDial(t, b2, "10.0.1.7@1")
	c2.heartbeat(t, "G", "", "T")
	check(query(c2))
}

// TestBrokerPopRestart pops without acking, closes the broker, starts it
// again on its data and lets the invisible time pass: the un-acked
// messages are revived (the checkpoints were durable), the acked one and
// those never popped are not repeated.
func TestBrokerPopRestart(t *testing.T) {
	subLeakCheck(t)
	dir := t.TempDir()
	clk := &subClock{}
	b := subBroker(t, dir, clk, WithPopReviveInterval(10*time.Millisecond))
	c := subDial(t, b, "10.0.1.8@1")
	sendBodies(t, c.Conn, "T", 0, "1", "2", "3", "4")
	r := popOnce(t, c.Conn, popArgs{group: "G", topic: "T", queue: 0, max: 3, invisibleMS: 5000})
	if len(r.msgs) != 3 {
		t.Fatalf("pop: %v", popBodies(r.msgs))
	}
	ack(t, c.Conn, "G", "T", r.msgs[0])
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := subBroker(t, dir, clk, WithPopReviveInterval(10*time.Millisecond))
	c2 := subDial(t, b2, "10.0.1.8@1")
	clk.advance(time.Minute)
	var got []popped
	waitFor(t, 10*time.Second, "the revived and the remaining messages", func() bool {
		got = append(got, popOnce(t, c2.Conn, popArgs{group: "G", topic: "T", queue: -1, max: 32, invisibleMS: 60000}).msgs...)
		return len(got) >= 3
	})
	if bs := popBodies(got); !slices.Equal(bs, []string{"2", "3", "4"}) {
		t.Errorf("after the restart: %v, want 2 3 (revived) and 4", bs)
	}
}

// waitRevived waits until the broker holds no checkpoint due by its clock
// (every due one was revived).
func waitRevived(t testing.TB, b *Broker) {
	t.Helper()
	waitFor(t, 10*time.Second, "the due checkpoints to be revived", func() bool {
		p := b.pop
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.mu.due) == 0 || p.mu.due[0].reviveAt() > p.nowMS()
	})
}

// TestBrokerPopKill9 pops from a broker process, acks half of the
// messages and kills the process with SIGKILL; a new process on the same
// data revives exactly the un-acked messages once their invisible time has
// passed, and hands out the ones never popped: no message is lost, none
// acked comes back.
func TestBrokerPopKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts broker processes")
	}
	subLeakCheck(t)
	dir := t.TempDir()
	cmd, addr := startChildBroker(t, dir)
	c := dial(t, addr)
	const n = 20
	for i := range n {
		send(t, c, "K", int32(i%2), []byte(strconv.Itoa(i)), "")
	}
	var popped []popped
	for len(popped) < 12 {
		r := decodePop(t, DefaultBrokerName, invoke(t, c, popReq(popArgs{group: "G", topic: "K", queue: -1, max: 4, invisibleMS: 1500})))
		popped = append(popped, r.msgs...)
	}
	acked := map[string]bool{}
	for i, p := range popped {
		if i%2 == 0 {
			if resp := invoke(t, c, ackReq("G", "K", p)); resp.Code != protocol.ResSuccess {
				t.Fatalf("ack: %d %q", resp.Code, resp.Remark)
			}
			acked[string(p.m.Body)] = true
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	_ = c.Close()

	_, addr = startChildBroker(t, dir)
	c = dial(t, addr)
	got := map[string]int{}
	waitFor(t, 20*time.Second, "every un-acked message", func() bool {
		r := decodePop(t, DefaultBrokerName, invoke(t, c, popReq(popArgs{group: "G", topic: "K", queue: -1, max: 32, invisibleMS: 60000})))
		for _, p := range r.msgs {
			got[string(p.m.Body)]++
		}
		return len(got)+len(acked) >= n
	})
	for b, k := range got {
		if acked[b] {
			t.Errorf("acked message %s came back", b)
		}
		if k != 1 {
			t.Errorf("message %s came %d times", b, k)
		}
	}
	if len(got)+len(acked) != n {
		t.Errorf("%d messages back, %d acked, of %d", len(got), len(acked), n)
	}
}
