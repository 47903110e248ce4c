package protocol

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
)

// Tests of the frames captured from Apache RocketMQ's Java client and broker
// (testdata/frames/README.md says how each was captured).

// TestCapturedJavaSendMessageV2 decodes the Java 5.3.3 client's
// SEND_MESSAGE_V2 in both header encodings into the typed header, and checks
// that runnel's binary encoder writes Java's binary frame byte for byte.
func TestCapturedJavaSendMessageV2(t *testing.T) {
	for _, tc := range []struct {
		name  string
		st    SerializeType
		props string
		born  int64
	}{
		{"send_message_v2_java_json.hex", SerializeJSON,
			"p\x01v\x02javapeer_i\x010\x02KEYS\x01key0\x02UNIQ_KEY\x01FD00000000000000000000000000000265D54E0E2F2A03671B5D0000\x02WAIT\x01true\x02TAGS\x01TagA\x02", 1796140288862},
		{"send_message_v2_java_rocketmq.hex", SerializeRocketMQ,
			"javapeer_i\x010\x02UNIQ_KEY\x01FD000000000000000000000000000002668F4E0E2F2A03672AD00000\x02WAIT\x01true\x02TAGS\x01TagA\x02", 1796140292817},
	} {
		t.Run(tc.name, func(t *testing.T) {
			golden := readHexFile(t, tc.name)
			c := decodeWhole(t, golden)
			if c.Code != ReqSendMessageV2 || c.Language != LanguageJava || c.Version != 479 || c.SerializeType() != tc.st || c.IsResponse() {
				t.Fatalf("header fields: %s", dumpCommand(c))
			}
			var h SendMessageRequestHeaderV2
			if err := h.Decode(c); err != nil {
				t.Fatal(err)
			}
			want := SendMessageRequestHeaderV2{ProducerGroup: "javapeer_producer", Topic: "runnel_frames_5_3_3", DefaultTopic: "TBW102",
				DefaultTopicQueueNums: 4, QueueID: 1, BornTimestamp: tc.born, Properties: tc.props,
				ReconsumeTimes: Some[int32](0), UnitMode: Some(false), Batch: Some(false), BrokerName: "broker-java"}
			if h != want {
				t.Fatalf("got  %+v\nwant %+v", h, want)
			}
			if string(c.Body) != "runnel_frames_5_3_3-0" {
				t.Fatalf("body %q", c.Body)
			}
			if tc.st == SerializeRocketMQ {
				again, err := c.AppendFrame(nil, SerializeRocketMQ)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(again, golden) {
					t.Fatalf("runnel's binary encoding differs from Java's\n got %x\nwant %x", again, golden)
				}
			}
		})
	}
}

// TestCapturedJavaSendResponseBinary decodes the Java 4.9.7 broker's binary
// answer to a binary SEND_MESSAGE_V2 (5.3.3 answers such a request in JSON)
// and re-encodes it byte for byte.
func TestCapturedJavaSendResponseBinary(t *testing.T) {
	golden := readHexFile(t, "send_response_java_rocketmq.hex")
	c := decodeWhole(t, golden)
	if !c.IsResponse() || c.Code != ResSuccess || c.Language != LanguageJava || c.Version != 407 || c.SerializeType() != SerializeRocketMQ {
		t.Fatalf("header fields: %s", dumpCommand(c))
	}
	var h SendMessageResponseHeader
	if err := h.Decode(c); err != nil {
		t.Fatal(err)
	}
	if want := (SendMessageResponseHeader{MsgID: "7F0000010000B05D0000000000000100", QueueID: 0, QueueOffset: 1, MsgRegion: "DefaultRegion", TraceOn: Some(true)}); h != want {
		t.Fatalf("got  %+v\nwant %+v", h, want)
	}
	again, err := c.AppendFrame(nil, SerializeRocketMQ)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, golden) {
		t.Fatalf("runnel's binary encoding differs from Java's\n got %x\nwant %x", again, golden)
	}
}

// TestCapturedJavaHeartbeat decodes the Java push consumer's HEART_BEAT body.
func TestCapturedJavaHeartbeat(t *testing.T) {
	c := decodeWhole(t, readHexFile(t, "heartbeat_consumer_java_json.hex"))
	if c.Code != ReqHeartbeat || c.NumExt() != 0 {
		t.Fatalf("header fields: %s", dumpCommand(c))
	}
	var hb HeartbeatData
	if err := hb.Decode(c.Body); err != nil {
		t.Fatal(err)
	}
	if hb.ClientID != "192.0.2.2@javapeer-26142" || len(hb.ProducerDataSet) != 1 || hb.ProducerDataSet[0].GroupName != "CLIENT_INNER_PRODUCER" || len(hb.ConsumerDataSet) != 1 {
		t.Fatalf("heartbeat %+v", hb)
	}
	cd := hb.ConsumerDataSet[0]
	if cd.GroupName != "runnel_frames_g" || cd.ConsumeType != ConsumePassively || cd.MessageModel != MessageModelClustering ||
		cd.ConsumeFromWhere != "CONSUME_FROM_FIRST_OFFSET" || len(cd.SubscriptionDataSet) != 2 {
		t.Fatalf("consumer data %+v", cd)
	}
	topics := []string{cd.SubscriptionDataSet[0].Topic, cd.SubscriptionDataSet[1].Topic}
	if !slices.Contains(topics, "runnel_frames_5_3_3") || !slices.Contains(topics, "%RETRY%runnel_frames_g") {
		t.Fatalf("subscriptions %+v", cd.SubscriptionDataSet)
	}
	for _, sd := range cd.SubscriptionDataSet {
		if sd.SubString != "*" || sd.ExpressionType != ExpressionTypeTag || sd.SubVersion < 1796140289746 || len(sd.TagsSet) != 0 {
			t.Fatalf("subscription %+v", sd)
		}
	}
}

// TestCapturedJavaPull decodes the Java client's PULL_MESSAGE and the Java
// broker's FOUND answer, whose body is the stored record of the message the
// Java producer sent (send_message_v2_java_json.hex).
func TestCapturedJavaPull(t *testing.T) {
	req := decodeWhole(t, readHexFile(t, "pull_request_java_json.hex"))
	var h PullMessageRequestHeader
	if err := h.Decode(req); err != nil {
		t.Fatal(err)
	}
	want := PullMessageRequestHeader{ConsumerGroup: "runnel_frames_g", Topic: "runnel_frames_5_3_3", QueueID: 1, QueueOffset: 0, MaxMsgNums: 32,
		SysFlag: PullFlagSuspend, CommitOffset: 0, SuspendTimeoutMillis: 15000, SubVersion: 1796140291098, ExpressionType: ExpressionTypeTag,
		MaxMsgBytes: Some[int32](262144), BrokerName: "broker-java"}
	if h != want {
		t.Fatalf("got  %+v\nwant %+v", h, want)
	}
	resp := decodeWhole(t, readHexFile(t, "pull_response_java_json.hex"))
	if !resp.IsResponse() || resp.Code != ResSuccess || resp.Opaque != req.Opaque || resp.Remark != "FOUND" {
		t.Fatalf("response header: %s", dumpCommand(resp))
	}
	var rh PullMessageResponseHeader
	if err := rh.Decode(resp); err != nil {
		t.Fatal(err)
	}
	if rh.NextBeginOffset != 1 || rh.MinOffset != 0 || rh.MaxOffset != 1 || rh.SuggestWhichBrokerID != 0 {
		t.Fatalf("response header %+v", rh)
	}
	var ms []MessageExt
	if err := DecodeRecords(resp.Body, func(m *MessageExt) bool { ms = append(ms, m.Clone()); return true }); err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 {
		t.Fatalf("%d records", len(ms))
	}
	m := ms[0]
	if m.Topic != "runnel_frames_5_3_3" || string(m.Body) != "runnel_frames_5_3_3-0" || m.QueueID != 1 || m.QueueOffset != 0 ||
		m.CommitLogOffset != 0 || m.SysFlag != 0 || m.StoreSize != 306 || m.BornTimestamp != 1796140288862 ||
		m.StoreHost != netip.MustParseAddrPort("127.0.0.1:38967") || !m.BornHost.Addr().IsLoopback() {
		t.Fatalf("record %+v", m)
	}
	if m.Tags() != "TagA" || m.Keys() != "key0" || m.UniqKey() != "FD00000000000000000000000000000265D54E0E2F2A03671B5D0000" {
		t.Fatalf("record properties %q", m.Properties)
	}
	for k, v := range map[string]string{"p": "v", "javapeer_i": "0", "WAIT": "true", "CLUSTER": "DefaultCluster", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"} {
		if got, _ := m.Property(k); got != v {
			t.Fatalf("property %s = %q, want %q", k, got, v)
		}
	}
	// The offset message id the broker answered the send with names this
	// record.
	if id := m.OffsetMsgID(); id != "7F000001000098370000000000000000" {
		t.Fatalf("offset msg id %s", id)
	}
	// runnel writes the record back byte for byte.
	again, err := m.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, resp.Body) {
		t.Fatalf("re-encoded record differs\n got %x\nwant %x", again, resp.Body)
	}
}

// TestCapturedJavaInnerBatchRecords decodes the Java 5.3.3 broker's pull
// answer from a queue.type=BatchCQ topic: a plain record, then two
// inner-batch records (SysFlagInnerBatch|SysFlagNeedUnwrap) whose bodies are
// batches of the Java producer's messages.
func TestCapturedJavaInnerBatchRecords(t *testing.T) {
	resp := decodeWhole(t, readHexFile(t, "pull_response_inner_batch_java_json.hex"))
	var recs []MessageExt
	if err := DecodeRecords(resp.Body, func(m *MessageExt) bool { recs = append(recs, m.Clone()); return true }); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].SysFlag != 0 || string(recs[0].Body) != "runnel" {
		t.Fatalf("%d records, first %+v", len(recs), recs[0])
	}
	for i, want := range []struct {
		off   int64
		items int
		num   string
	}{{1, 3, "3"}, {4, 2, "2"}} {
		r := recs[i+1]
		if r.SysFlag != SysFlagInnerBatch|SysFlagNeedUnwrap || r.QueueOffset != want.off {
			t.Fatalf("record %d: sysflag %#x offset %d", i+1, r.SysFlag, r.QueueOffset)
		}
		if v, _ := r.Property("INNER_NUM"); v != want.num {
			t.Fatalf("record %d: INNER_NUM %q", i+1, v)
		}
		n := 0
		if err := DecodeBatch(r.Body, 0, func(flag int32, body []byte, props string) error {
			if _, ok := PropertyValue(props, PropUniqKey); !ok || len(body) == 0 {
				t.Errorf("record %d item %d: body %q props %q", i+1, n, body, props)
			}
			n++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n != want.items {
			t.Fatalf("record %d: %d batch items, want %d", i+1, n, want.items)
		}
	}
}

// TestCapturedJavaLockBatch decodes the Java client's LOCK_BATCH_MQ body and
// the broker's answer.
func TestCapturedJavaLockBatch(t *testing.T) {
	req := decodeWhole(t, readHexFile(t, "lock_batch_request_java_json.hex"))
	var lb LockBatchRequestBody
	if err := lb.Decode(req.Body); err != nil {
		t.Fatal(err)
	}
	q := MessageQueue{Topic: "runnel_frames_5_3_3", BrokerName: "broker-java", QueueID: 0}
	if lb.ClientID != "192.0.2.2@javapeer-26142" || lb.ConsumerGroup != "runnel_frames_g" || lb.OnlyThisBroker || !slices.Equal(lb.MQSet, []MessageQueue{q}) {
		t.Fatalf("lock request %+v", lb)
	}
	resp := decodeWhole(t, readHexFile(t, "lock_batch_response_java_json.hex"))
	var lr LockBatchResponseBody
	if err := lr.Decode(resp.Body); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lr.LockOKMQSet, []MessageQueue{q}) {
		t.Fatalf("lock response %+v", lr)
	}
}

// TestCapturedJavaBrokerRequests decodes the requests the Java broker sends
// to clients: NOTIFY_CONSUMER_IDS_CHANGED and CHECK_TRANSACTION_STATE (both
// oneway, JSON), the latter with the half message's record as body.
func TestCapturedJavaBrokerRequests(t *testing.T) {
	n := decodeWhole(t, readHexFile(t, "notify_consumer_ids_changed_java_json.hex"))
	var nh NotifyConsumerIDsChangedRequestHeader
	if err := nh.Decode(n); err != nil {
		t.Fatal(err)
	}
	if n.Code != ReqNotifyConsumerIDsChanged || !n.IsOneway() || nh.ConsumerGroup != "runnel_frames_g" {
		t.Fatalf("notify %s", dumpCommand(n))
	}
	c := decodeWhole(t, readHexFile(t, "check_transaction_state_java_json.hex"))
	var ch CheckTransactionStateRequestHeader
	if err := ch.Decode(c); err != nil {
		t.Fatal(err)
	}
	want := CheckTransactionStateRequestHeader{Topic: "RMQ_SYS_TRANS_HALF_TOPIC", TranStateTableOffset: 1, CommitLogOffset: 2319,
		MsgID: "7F00000163E14F25637E03673710F7A2", TransactionID: "7F00000163E14F25637E03673710F7A2",
		OffsetMsgID: "7F00000100009837000000000000090F", BrokerName: "broker-java"}
	if c.Code != ReqCheckTransactionState || !c.IsOneway() || ch != want {
		t.Fatalf("check header %+v\nwant %+v", ch, want)
	}
	m, n2, err := DecodeRecord(c.Body)
	if err != nil || n2 != len(c.Body) {
		t.Fatalf("check body: %v (%d of %d bytes)", err, n2, len(c.Body))
	}
	// The record is the re-put half message with its real topic and queue
	// restored, at the offsets the header names.
	if m.Topic != "runnel_frames_5_3_3" || m.QueueID != 1 || m.CommitLogOffset != ch.CommitLogOffset || m.QueueOffset != ch.TranStateTableOffset ||
		m.UniqKey() != ch.MsgID || m.OffsetMsgID() != ch.OffsetMsgID || string(m.Body) != "half, checked back" {
		t.Fatalf("check record %+v", m)
	}
	if g, _ := m.Property(PropProducerGroup); g != "runnel_frames_g1_pg" {
		t.Fatalf("PGROUP %q", g)
	}
	if v, _ := m.Property(PropTransactionPrepared); v != "true" {
		t.Fatalf("TRAN_MSG %q", v)
	}
}
