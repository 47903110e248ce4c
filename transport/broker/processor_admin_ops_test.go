package broker

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestBrokerAdminRuntimeInfo: GET_BROKER_RUNTIME_INFO (mqadmin clusterList,
// brokerStatus) answers a KVTable under Java's keys: the version, the put
// and get rates as three figures, the message totals, the earliest stored
// message's time and the disk ratio. (runnel answered
// REQUEST_CODE_NOT_SUPPORTED, which made both commands fail.)
func TestBrokerAdminRuntimeInfo(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	var first int64
	for i := range 5 {
		rh := send(t, c, "RtTopic", 0, []byte("m"+itoa(i)), "")
		if i == 0 {
			r := pull(t, c, pullArgs{topic: "RtTopic", queue: rh.QueueID, offset: rh.QueueOffset, max: 1})
			if len(r.msgs) != 1 {
				t.Fatalf("pull of the first message: %d messages (code %d)", len(r.msgs), r.code)
			}
			first = r.msgs[0].StoreTimestamp
		}
	}
	resp := invoke(t, c, protocol.NewRequest(reqGetBrokerRuntimeInfo))
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("GET_BROKER_RUNTIME_INFO: %d %s", resp.Code, resp.Remark)
	}
	var kv protocol.KVTable
	if err := kv.Decode(resp.Body); err != nil {
		t.Fatal(err)
	}
	tab := kv.Table
	for k, want := range map[string]string{
		"brokerVersionDesc": "V5_3_3", "brokerVersion": "479", "brokerActive": "true",
		"msgPutTotalTodayNow": "5", "msgGetTotalTodayNow": "1", "earliestMessageTimeStamp": strconv.FormatInt(first, 10),
	} {
		if tab[k] != want {
			t.Errorf("%s = %q, want %q", k, tab[k], want)
		}
	}
	if tab["getTransferedTps"] != tab["getTransferredTps"] {
		t.Errorf("getTransferedTps (4.x) = %q, getTransferredTps %q", tab["getTransferedTps"], tab["getTransferredTps"])
	}
	for _, k := range []string{"putTps", "getTransferredTps"} {
		f := strings.Fields(tab[k])
		if len(f) != 3 {
			t.Errorf("%s = %q, want three rates", k, tab[k])
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err != nil || v <= 0 {
			t.Errorf("%s = %q: the 10 s rate should count the messages just sent", k, tab[k])
		}
	}
	if r, err := strconv.ParseFloat(tab["commitLogDiskRatio"], 64); err != nil || r <= 0 || r > 1 {
		t.Errorf("commitLogDiskRatio = %q, want a ratio in (0, 1]", tab["commitLogDiskRatio"])
	}
	if !strings.HasPrefix(tab["commitLogDirCapacity"], "Total : ") {
		t.Errorf("commitLogDirCapacity = %q", tab["commitLogDirCapacity"])
	}
}

// TestBrokerAdminTopicConsumeByWho: QUERY_TOPIC_CONSUME_BY_WHO (mqadmin
// queryMsgById's consumption track) names the groups online with a
// subscription to the topic and those with a committed offset of it, as
// Java's AdminBrokerProcessor does.
func TestBrokerAdminTopicConsumeByWho(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	send(t, c, "WhoTopic", 0, []byte("x"), "")
	send(t, c, "OtherTopic", 0, []byte("x"), "")
	online := subDial(t, b, "127.0.0.1@online")
	if resp := online.heartbeat(t, "gOnline", "", "WhoTopic"); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %s", resp.Code, resp.Remark)
	}
	if resp := online.heartbeat(t, "gOther", "", "OtherTopic"); resp.Code != protocol.ResSuccess {
		t.Fatalf("heartbeat: %d %s", resp.Code, resp.Remark)
	}
	commit := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
	(&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "gOffset", Topic: "WhoTopic", QueueID: 0, CommitOffset: 1}).Encode(commit)
	if resp := invoke(t, c, commit); resp.Code != protocol.ResSuccess {
		t.Fatalf("UPDATE_CONSUMER_OFFSET: %d %s", resp.Code, resp.Remark)
	}
	who := func(topic string) []string {
		req := protocol.NewRequest(protocol.ReqQueryTopicConsumeByWho)
		(&protocol.QueryTopicConsumeByWhoRequestHeader{Topic: topic}).Encode(req)
		resp := invoke(t, c, req)
		if resp.Code != protocol.ResSuccess {
			t.Fatalf("QUERY_TOPIC_CONSUME_BY_WHO %s: %d %s", topic, resp.Code, resp.Remark)
		}
		var gl struct {
			GroupList []string `json:"groupList"`
		}
		if err := json.Unmarshal(resp.Body, &gl); err != nil {
			t.Fatalf("body %q: %v", resp.Body, err)
		}
		return gl.GroupList
	}
	if got, want := who("WhoTopic"), []string{"gOffset", "gOnline"}; !slices.Equal(got, want) {
		t.Errorf("groups of WhoTopic: %v, want %v", got, want)
	}
	if got := who("NoSuchTopic"); got == nil || len(got) != 0 {
		t.Errorf("groups of an unknown topic: %#v, want an empty list", got)
	}
}

// TestBrokerAdminResetOffset: INVOKE_BROKER_TO_RESET_OFFSET (mqadmin
// resetOffsetByTime) sets the group's offsets itself, as 5.x brokers do by
// default (useServerSideResetOffset): by timestamp for every read queue, to
// each queue's end for a negative timestamp, to a given offset of one
// queue; it answers the offsets in a ResetOffsetBody and passes them to
// the group's online consumers as RESET_CONSUMER_CLIENT_OFFSET. Unknown
// topics, groups and out-of-range offsets get Java's codes.
func TestBrokerAdminResetOffset(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	var stored [2][]int64 // store times per queue
	for i := range 6 {
		q := int32(i % 2)
		rh := send(t, c, "RstTopic", q, []byte("m"+itoa(i)), "")
		r := pull(t, c, pullArgs{topic: "RstTopic", queue: q, offset: rh.QueueOffset, max: 1})
		stored[q] = append(stored[q], r.msgs[0].StoreTimestamp)
		time.Sleep(5 * time.Millisecond) // distinct store times
	}
	consumer := subDial(t, b, "127.0.0.1@rst")
	consumer.heartbeat(t, "gRst", "", "RstTopic")
	reset := func(group, topic string, ts int64, queue int32, off int64) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqInvokeBrokerToResetOffset)
		h := protocol.ResetOffsetRequestHeader{Group: group, Topic: topic, Timestamp: ts, IsForce: true}
		if queue >= 0 {
			h.QueueID, h.Offset = protocol.Some(queue), protocol.Some(off)
		}
		h.Encode(req)
		return invoke(t, c, req)
	}
	offsetOf := func(q int32) int64 {
		req := protocol.NewRequest(protocol.ReqQueryConsumerOffset)
		(&protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: "gRst", Topic: "RstTopic", QueueID: q}).Encode(req)
		resp := invoke(t, c, req)
		var rh protocol.QueryConsumerOffsetResponseHeader
		if err := rh.Decode(resp); err != nil {
			t.Fatalf("QUERY_CONSUMER_OFFSET %d: %d %s: %v", q, resp.Code, resp.Remark, err)
		}
		return rh.Offset
	}
	body := func(resp *protocol.Command) map[int32]int64 {
		t.Helper()
		if resp.Code != protocol.ResSuccess {
			t.Fatalf("INVOKE_BROKER_TO_RESET_OFFSET: %d %s", resp.Code, resp.Remark)
		}
		var rb protocol.ResetOffsetBody
		if err := rb.Decode(resp.Body); err != nil {
			t.Fatal(err)
		}
		out := map[int32]int64{}
		for mq, off := range rb.OffsetTable {
			if mq.Topic != "RstTopic" || mq.BrokerName != DefaultBrokerName {
				t.Errorf("reset body names queue %v", mq)
			}
			out[mq.QueueID] = off
		}
		return out
	}

	// To the store time of each queue's second message: offset 1.
	ts := max(stored[0][1], stored[1][1])
	got := body(reset("gRst", "RstTopic", ts, -1, 0))
	want := map[int32]int64{}
	for q := range int32(2) {
		want[q] = int64(slices.IndexFunc(stored[q], func(s int64) bool { return s >= ts }))
		if got[q] != want[q] || offsetOf(q) != want[q] {
			t.Errorf("reset to %d: queue %d answered %d, committed %d, want %d", ts, q, got[q], offsetOf(q), want[q])
		}
	}
	if len(got) != 4 { // the auto-created topic has 4 queues
		t.Errorf("reset answered %d queues, want the topic's 4: %v", len(got), got)
	}
	waitFor(t, 5*time.Second, "RESET_CONSUMER_CLIENT_OFFSET", func() bool {
		return len(consumer.requests(protocol.ReqResetConsumerClientOffset)) > 0
	})
	n := consumer.requests(protocol.ReqResetConsumerClientOffset)[0]
	var nh protocol.ResetOffsetRequestHeader
	if err := nh.Decode(n); err != nil || nh.Group != "gRst" || nh.Topic != "RstTopic" || nh.Timestamp != ts {
		t.Errorf("notification header %+v (%v)", nh, err)
	}
	var nb protocol.ResetOffsetBody
	if err := nb.Decode(n.Body); err != nil || len(nb.OffsetTable) != len(got) {
		t.Errorf("notification body %q (%v)", n.Body, err)
	}

	// To the end.
	got = body(reset("gRst", "RstTopic", -1, -1, 0))
	if got[0] != 3 || got[1] != 3 || offsetOf(0) != 3 {
		t.Errorf("reset to the end: %v, committed %d", got, offsetOf(0))
	}
	// One queue, to an offset; out of range is refused.
	if got = body(reset("gRst", "RstTopic", 0, 1, 2)); len(got) != 1 || got[1] != 2 || offsetOf(1) != 2 {
		t.Errorf("reset of queue 1 to 2: %v, committed %d", got, offsetOf(1))
	}
	if resp := reset("gRst", "RstTopic", 0, 1, 9); resp.Code != protocol.ResSystemError {
		t.Errorf("reset beyond the queue: %d %s, want SYSTEM_ERROR", resp.Code, resp.Remark)
	}
	if resp := reset("gNone", "RstTopic", -1, -1, 0); resp.Code != protocol.ResSubscriptionGroupNotExist {
		t.Errorf("reset of an unknown group: %d %s, want SUBSCRIPTION_GROUP_NOT_EXIST", resp.Code, resp.Remark)
	}
	if resp := reset("gRst", "NoTopic", -1, -1, 0); resp.Code != protocol.ResTopicNotExist {
		t.Errorf("reset of an unknown topic: %d %s, want TOPIC_NOT_EXIST", resp.Code, resp.Remark)
	}
}

// TestBrokerAdminConsumeStatsLastTime: GET_CONSUME_STATS's lastTimestamp
// (mqadmin consumerProgress's #LastTime) is the store time of the last
// message the group consumed, the one before its committed offset, as
// Java's AdminBrokerProcessor answers, and 0 when it consumed none; runnel
// answered the store time of the queue's newest message.
func TestBrokerAdminConsumeStatsLastTime(t *testing.T) {
	b := startBroker(t)
	c := dial(t, b.Addr())
	var times []int64
	for i := range 3 {
		rh := send(t, c, "LtTopic", 0, []byte("m"+itoa(i)), "")
		r := pull(t, c, pullArgs{topic: "LtTopic", queue: 0, offset: rh.QueueOffset, max: 1})
		times = append(times, r.msgs[0].StoreTimestamp)
		time.Sleep(5 * time.Millisecond)
	}
	stats := func() map[int32]protocol.OffsetWrapper {
		req := protocol.NewRequest(protocol.ReqGetConsumeStats)
		(&protocol.GetConsumeStatsRequestHeader{ConsumerGroup: "gLt", Topic: "LtTopic"}).Encode(req)
		resp := invoke(t, c, req)
		if resp.Code != protocol.ResSuccess {
			t.Fatalf("GET_CONSUME_STATS: %d %s", resp.Code, resp.Remark)
		}
		var cs protocol.ConsumeStats
		if err := cs.Decode(resp.Body); err != nil {
			t.Fatal(err)
		}
		out := map[int32]protocol.OffsetWrapper{}
		for mq, w := range cs.OffsetTable {
			out[mq.QueueID] = w
		}
		return out
	}
	if w := stats()[0]; w.LastTimestamp != 0 || w.BrokerOffset != 3 {
		t.Errorf("nothing consumed: %+v, want broker offset 3 and lastTimestamp 0", w)
	}
	commit := protocol.NewRequest(protocol.ReqUpdateConsumerOffset)
	(&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "gLt", Topic: "LtTopic", QueueID: 0, CommitOffset: 2}).Encode(commit)
	if resp := invoke(t, c, commit); resp.Code != protocol.ResSuccess {
		t.Fatalf("UPDATE_CONSUMER_OFFSET: %d %s", resp.Code, resp.Remark)
	}
	if w := stats()[0]; w.LastTimestamp != times[1] || w.ConsumerOffset != 2 {
		t.Errorf("consumed up to offset 2: %+v, want lastTimestamp %d (message 1's store time; the newest is %d)", w, times[1], times[2])
	}
}
