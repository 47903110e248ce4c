package protocol

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// The receipt handle as Java's ExtraInfoUtil.buildExtraInfo writes it
// (eight fields) and as old brokers did (seven).
func TestPopExtraInfo(t *testing.T) {
	e := ExtraInfo{CkQueueOffset: 100, PopTime: 1700000000123, InvisibleTime: 30000, ReviveQID: 3,
		Retry: PopRetryFlag("%RETRY%G_T"), BrokerName: "broker-a", QueueID: 2, MsgQueueOffset: 105}
	const want = "100 1700000000123 30000 3 1 broker-a 2 105"
	if got := e.String(); got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	back, err := ParseExtraInfo(want)
	if err != nil || back != e {
		t.Fatalf("ParseExtraInfo = %+v, %v; want %+v", back, err, e)
	}
	seven, err := ParseExtraInfo("7 1 2 999 0 b 1")
	if err != nil || seven.MsgQueueOffset != -1 || !seven.Order() {
		t.Fatalf("seven fields: %+v %v", seven, err)
	}
	for _, bad := range []string{"", "1 2 3", "x 1 2 3 0 b 1", "1 2 3 4 0 b q 9"} {
		if _, err := ParseExtraInfo(bad); err == nil {
			t.Errorf("ParseExtraInfo(%q) succeeded", bad)
		}
	}
}

func TestPopRetryTopics(t *testing.T) {
	for _, c := range []struct{ topic, flag string }{
		{"T", PopNormalTopic}, {PopRetryTopicV1("T", "G"), PopRetryV1}, {PopRetryTopicV2("T", "G"), PopRetryV2},
		{"%RETRY%G", PopRetryV1},
	} {
		if got := PopRetryFlag(c.topic); got != c.flag {
			t.Errorf("PopRetryFlag(%q) = %q, want %q", c.topic, got, c.flag)
		}
	}
	if got, _ := PopRealTopic("T", "G", PopRetryV1); got != "%RETRY%G_T" {
		t.Errorf("PopRealTopic v1 = %q", got)
	}
	if got, _ := PopRealTopic("T", "G", PopRetryV2); got != "%RETRY%G+T" {
		t.Errorf("PopRealTopic v2 = %q", got)
	}
	if _, err := PopRealTopic("T", "G", "7"); err == nil {
		t.Error("PopRealTopic accepted flag 7")
	}
}

// The offset infos of a POP response, item by item as ExtraInfoUtil's
// build* methods write them, parsed back with Java's keys.
func TestPopOffsetInfos(t *testing.T) {
	var start, msgs, order []byte
	start = AppendStartOffsetInfo(start, "T", 0, 10)
	start = AppendStartOffsetInfo(start, "%RETRY%G_T", 0, 3)
	msgs = AppendMsgOffsetInfo(msgs, "T", 0, []int64{10, 11, 13})
	order = AppendOrderCountInfo(order, "TOPIC", 0, 1234, 2)
	order = AppendOrderCountInfo(order, "TOPIC", 0, -1, 1)
	if string(start) != "0 0 10;1 0 3" || string(msgs) != "0 0 10,11,13" || string(order) != "0 qo0%1234 2;0 0 1" {
		t.Fatalf("infos %q %q %q", start, msgs, order)
	}
	s, err := ParsePopOffsetInfo(string(start))
	if err != nil || s[PopInfoKey("T", 0)][0] != 10 || s[PopInfoKey("%RETRY%G_T", 0)][0] != 3 {
		t.Fatalf("start %v %v", s, err)
	}
	m, err := ParsePopOffsetInfo(string(msgs))
	if err != nil || !slices.Equal(m[PopInfoKey("T", 0)], []int64{10, 11, 13}) {
		t.Fatalf("msgs %v %v", m, err)
	}
	o, err := ParsePopOffsetInfo(string(order))
	if err != nil || o[PopOrderCountKey("TOPIC", 0, 1234)][0] != 2 || o[PopInfoKey("TOPIC", 0)][0] != 1 {
		t.Fatalf("order %v %v", o, err)
	}
	for _, bad := range []string{"0 0", "0 0 1;0 0 2", "0 0 x"} {
		if _, err := ParsePopOffsetInfo(bad); err == nil {
			t.Errorf("ParsePopOffsetInfo(%q) succeeded", bad)
		}
	}
}

// A BATCH_ACK_MESSAGE body as fastjson writes Java's BatchAckTest object
// (short names, BitSet.toByteArray as base64: bits 1, 3, 5 = 0x2a), and
// the long alternate names it also reads.
func TestPopBatchAckJSON(t *testing.T) {
	a := BatchAck{ConsumerGroup: "G", Topic: "myTopic", Retry: "0", StartOffset: 100, QueueID: 1, ReviveQueueID: 2,
		PopTime: 1700000000000, InvisibleTime: 5000, Bits: []int{1, 3, 5}}
	body := BatchAckMessageRequestBody{BrokerName: "b", Acks: []BatchAck{a}}
	enc, err := body.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(enc), `"b":"Kg=="`) || !strings.Contains(string(enc), `"so":100`) {
		t.Fatalf("encoded %s", enc)
	}
	var back BatchAckMessageRequestBody
	if err := back.Decode(enc); err != nil {
		t.Fatal(err)
	}
	if got := back.Acks[0]; !slices.Equal(got.Bits, a.Bits) || got.StartOffset != 100 || got.ReviveQueueID != 2 || got.Topic != "myTopic" {
		t.Fatalf("decoded %+v", got)
	}
	var long BatchAck
	if err := json.Unmarshal([]byte(`{"consumerGroup":"G","topic":"T","retry":"1","startOffset":7,"queueId":3,`+
		`"reviveQueueId":999,"popTime":5,"invisibleTime":6,"bitSet":"AQI="}`), &long); err != nil {
		t.Fatal(err)
	}
	if long.StartOffset != 7 || long.QueueID != 3 || long.ReviveQueueID != 999 || !slices.Equal(long.Bits, []int{0, 9}) {
		t.Fatalf("long names %+v", long)
	}
	if _, err := (BatchAck{Bits: []int{-1}}).MarshalJSON(); err == nil {
		t.Error("a negative bit was encoded")
	}
}
