package broker

import (
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func (c *subClient) sendBack(t testing.TB, group string, phys int64, delayLevel int32, maxTimes protocol.Opt[int32]) *protocol.Command {
	t.Helper()
	req := protocol.NewRequest(protocol.ReqConsumerSendMsgBack)
	h := protocol.ConsumerSendMsgBackRequestHeader{Group: group, Offset: phys, DelayLevel: delayLevel,
		OriginTopic: "T", MaxReconsumeTimes: maxTimes}
	h.Encode(req)
	return c.invoke(t, req)
}

func physOf(t testing.TB, resp *protocol.Command) (string, int64) {
	t.Helper()
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("send failed: %d %q", resp.Code, resp.Remark)
	}
	id, _ := resp.Ext("msgId")
	_, phys, err := protocol.ParseOffsetMsgID(id)
	if err != nil {
		t.Fatal(err)
	}
	return id, phys
}

func wantProps(t testing.TB, m *protocol.MessageExt, kv ...string) {
	t.Helper()
	for i := 0; i < len(kv); i += 2 {
		v, ok := m.Property(kv[i])
		switch {
		case kv[i+1] == "" && ok:
			t.Errorf("%s/%d@%d: property %s = %q, want absent", m.Topic, m.QueueID, m.QueueOffset, kv[i], v)
		case kv[i+1] != "" && v != kv[i+1]:
			t.Errorf("%s/%d@%d: property %s = %q, want %q", m.Topic, m.QueueID, m.QueueOffset, kv[i], v, kv[i+1])
		}
	}
}

func TestBrokerRetrySendBack(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "client-1")
	c.heartbeat(t, "g", "", "T")
	origID, phys := physOf(t, c.send(t, protocol.ReqSendMessage, "T", 0, "hello", map[string]string{"TAGS": "a"}, 0, 0))
	orig := subMessages(t, b, "T", 0)[0]

	if resp := c.sendBack(t, "g", phys, 0, protocol.Some[int32](16)); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back: %d %q", resp.Code, resp.Remark)
	}
	// reconsumeTimes 0 → level 3 (10 s): queue 2 of the schedule topic.
	sched := subMessages(t, b, topicSchedule, 2)
	if len(sched) != 1 {
		t.Fatalf("schedule queue 2 holds %d messages, want 1", len(sched))
	}
	wantProps(t, &sched[0], "REAL_TOPIC", "%RETRY%g", "REAL_QID", "0", "DELAY", "3", "RETRY_TOPIC", "T")

	retried := func() int { return len(subMessages(t, b, "%RETRY%g", 0)) }
	subNever(t, 300*time.Millisecond, func() bool { return retried() > 0 }, "retry delivery")
	clk.advance(8 * time.Second)
	subNever(t, 300*time.Millisecond, func() bool { return retried() > 0 }, "retry delivery before 10 s")
	clk.advance(2500 * time.Millisecond)
	subWaitHolds(t, b, "%RETRY%g", 0, 1)
	r := subMessages(t, b, "%RETRY%g", 0)[0]
	if string(r.Body) != "hello" || r.ReconsumeTimes != 1 || r.BornTimestamp != orig.BornTimestamp {
		t.Errorf("retry message: body %q reconsume %d born %d", r.Body, r.ReconsumeTimes, r.BornTimestamp)
	}
	wantProps(t, &r, "RETRY_TOPIC", "T", "WAIT", "false", "ORIGIN_MESSAGE_ID", origID, "TAGS", "a", "DELAY", "",
		"REAL_TOPIC", "%RETRY%g", "REAL_QID", "0", "UNIQ_KEY", orig.UniqKey())

	// Retry budget spent (reconsumeTimes 1 >= max 1) → DLQ, ORIGIN kept.
	if resp := c.sendBack(t, "g", r.CommitLogOffset, 0, protocol.Some[int32](1)); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back: %d %q", resp.Code, resp.Remark)
	}
	dlq := subMessages(t, b, "%DLQ%g", 0)
	if len(dlq) != 1 || dlq[0].ReconsumeTimes != 2 {
		t.Fatalf("DLQ = %d messages (%+v)", len(dlq), dlq)
	}
	wantProps(t, &dlq[0], "ORIGIN_MESSAGE_ID", origID, "RETRY_TOPIC", "T", "DELAY", "", "WAIT", "false")
	if tc, ok := b.topicConfig("%DLQ%g"); !ok || queueCount(tc) != 1 || tc.Perm != protocol.PermRead|protocol.PermWrite {
		t.Errorf("DLQ topic = %+v %v", tc, ok)
	}
	// Without a maxReconsumeTimes header the group's 16 applies: back to retry.
	if resp := c.sendBack(t, "g", r.CommitLogOffset, 0, protocol.Opt[int32]{}); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back: %d", resp.Code)
	}
	if n := len(subMessages(t, b, topicSchedule, 3)); n != 1 { // 3 + reconsumeTimes 1 = level 4
		t.Errorf("schedule queue 3 holds %d, want 1", n)
	}
	// delayLevel < 0 → DLQ at once.
	if resp := c.sendBack(t, "g", phys, -1, protocol.Some[int32](16)); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back -1: %d", resp.Code)
	}
	if n := len(subMessages(t, b, "%DLQ%g", 0)); n != 2 {
		t.Errorf("DLQ holds %d, want 2", n)
	}
	// An explicit delay level is honoured.
	if resp := c.sendBack(t, "g", phys, 1, protocol.Some[int32](16)); resp.Code != protocol.ResSuccess {
		t.Fatalf("send back level 1: %d", resp.Code)
	}
	if n := len(subMessages(t, b, topicSchedule, 0)); n != 1 {
		t.Errorf("schedule queue 0 holds %d, want 1", n)
	}
	// Unknown offset.
	if resp := c.sendBack(t, "g", 1<<40, 0, protocol.Some[int32](16)); resp.Code != protocol.ResSystemError {
		t.Errorf("unknown offset: code %d", resp.Code)
	}
}

func TestBrokerRetryUnknownGroup(t *testing.T) {
	subLeakCheck(t)
	b := subBroker(t, t.TempDir(), &subClock{}, WithAutoCreateGroups(false))
	c := subDial(t, b, "client-1")
	_, phys := physOf(t, c.send(t, protocol.ReqSendMessage, "T", 0, "x", nil, 0, 0))
	if resp := c.sendBack(t, "nogroup", phys, 0, protocol.Some[int32](16)); resp.Code != protocol.ResSubscriptionGroupNotExist {
		t.Errorf("send back, unknown group: code %d %q", resp.Code, resp.Remark)
	}
	if resp := c.send(t, protocol.ReqSendMessage, "%RETRY%nogroup", 0, "x", nil, 1, 16); resp.Code != protocol.ResSubscriptionGroupNotExist {
		t.Errorf("send to retry topic, unknown group: code %d %q", resp.Code, resp.Remark)
	}
}

func TestBrokerRetryFallbackSend(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "client-1")
	c.heartbeat(t, "g", "", "T")
	props := map[string]string{"RETRY_TOPIC": "T", "ORIGIN_MESSAGE_ID": "X", "DELAY": "4"}

	// Within the budget: scheduled for %RETRY%g (level 4, queue 3).
	if resp := c.send(t, protocol.ReqSendMessage, "%RETRY%g", 0, "a", props, 2, 16); resp.Code != protocol.ResSuccess {
		t.Fatalf("send: %d %q", resp.Code, resp.Remark)
	}
	s := subMessages(t, b, topicSchedule, 3)
	if len(s) != 1 {
		t.Fatalf("schedule queue 3 holds %d", len(s))
	}
	wantProps(t, &s[0], "REAL_TOPIC", "%RETRY%g", "RETRY_TOPIC", "T")

	// reconsumeTimes 3 > maxReconsumeTimes 2 → DLQ with DELAY=-1.
	if resp := c.send(t, protocol.ReqSendMessage, "%RETRY%g", 0, "b", props, 3, 2); resp.Code != protocol.ResSuccess {
		t.Fatalf("send: %d %q", resp.Code, resp.Remark)
	}
	dlq := subMessages(t, b, "%DLQ%g", 0)
	if len(dlq) != 1 || string(dlq[0].Body) != "b" {
		t.Fatalf("DLQ = %+v", dlq)
	}
	wantProps(t, &dlq[0], "DELAY", "-1", "RETRY_TOPIC", "T", "REAL_TOPIC", "")

	// An orderly group (holding queue locks) sends retries straight to the DLQ.
	c.lockBatch(t, protocol.ReqLockBatchMq, "g", protocol.MessageQueue{Topic: "T", BrokerName: "broker-a"})
	if resp := c.send(t, protocol.ReqSendMessage, "%RETRY%g", 0, "c", props, 1, 16); resp.Code != protocol.ResSuccess {
		t.Fatalf("send: %d %q", resp.Code, resp.Remark)
	}
	if dlq := subMessages(t, b, "%DLQ%g", 0); len(dlq) != 2 || string(dlq[1].Body) != "c" {
		t.Fatalf("orderly group: DLQ holds %d", len(dlq))
	}
	// Once the locks expired the group counts as concurrent again.
	clk.advance(61 * time.Second)
	if resp := c.send(t, protocol.ReqSendMessage, "%RETRY%g", 0, "d", props, 1, 16); resp.Code != protocol.ResSuccess {
		t.Fatalf("send: %d %q", resp.Code, resp.Remark)
	}
	if n := len(subMessages(t, b, "%DLQ%g", 0)); n != 2 {
		t.Fatalf("after lock expiry: DLQ holds %d, want 2", n)
	}
	if n := len(subMessages(t, b, topicSchedule, 3)); n != 2 {
		t.Fatalf("after lock expiry: schedule queue 3 holds %d, want 2", n)
	}
}
