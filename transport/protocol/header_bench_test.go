package protocol

import "testing"

func benchSendHeader() SendMessageRequestHeader {
	return SendMessageRequestHeader{
		ProducerGroup: "please_rename_unique_group_name", Topic: "TopicTest", DefaultTopic: "TBW102",
		DefaultTopicQueueNums: 4, QueueID: 3, BornTimestamp: 1700000000123,
		Properties:     "KEYS\x01order-42\x02TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000100002A9F00000000000000FF\x02WAIT\x01true\x02",
		ReconsumeTimes: Some[int32](0), UnitMode: Some(false), Batch: Some(false), MaxReconsumeTimes: Some[int32](0),
		BrokerName: "broker-a",
	}
}

// BenchmarkTypedHeaderEncode measures building a SEND_MESSAGE command from
// its typed header and framing it into a reused buffer.
func BenchmarkTypedHeaderEncode(b *testing.B) {
	h := benchSendHeader()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		c := NewRequest(ReqSendMessage)
		h.Encode(c)
		var err error
		if buf, err = c.AppendFrame(buf[:0], SerializeJSON); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTypedHeaderDecode measures filling the typed header from a
// decoded command's extFields.
func BenchmarkTypedHeaderDecode(b *testing.B) {
	h := benchSendHeader()
	c := NewRequest(ReqSendMessage)
	h.Encode(c)
	var got SendMessageRequestHeader
	b.ReportAllocs()
	for b.Loop() {
		if err := got.Decode(c); err != nil {
			b.Fatal(err)
		}
	}
}
