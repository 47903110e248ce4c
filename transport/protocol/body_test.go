package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func readBody(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/bodies/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantRoute() TopicRouteData {
	return TopicRouteData{
		QueueDatas: []QueueData{{BrokerName: "broker-a", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}},
		BrokerDatas: []BrokerData{{Cluster: "DefaultCluster", BrokerName: "broker-a",
			BrokerAddrs: map[int64]string{0: "10.0.0.5:10911", 1: "10.0.0.6:10911"}}},
		FilterServerTable: map[string][]string{},
	}
}

func TestRouteDataGolden(t *testing.T) {
	standard := readBody(t, "route_standard.json")
	want := wantRoute()
	got, err := want.Encode()
	if err != nil || !bytes.Equal(got, standard) {
		t.Fatalf("encode:\n got %s\nwant %s", got, standard)
	}
	for _, name := range []string{"route_standard.json", "route_fastjson.json", "route_whitespace.json"} {
		var r TopicRouteData
		if err := r.Decode(readBody(t, name)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(r, want) {
			t.Fatalf("%s: decoded %+v", name, r)
		}
		// Whatever the input form, our output is the compact standard form.
		if again, _ := r.Encode(); !bytes.Equal(again, standard) {
			t.Fatalf("%s: re-encoded %s", name, again)
		}
		if r.BrokerDatas[0].MasterAddr() != "10.0.0.5:10911" {
			t.Fatal("master")
		}
	}
}

func TestRouteDataEncodeShapes(t *testing.T) {
	// Empty route: arrays and objects present, brokerAddrs present even when
	// empty, numeric key order (2 < 10), non-ASCII escaped.
	r := TopicRouteData{
		OrderTopicConf: "broker-a:4",
		BrokerDatas: []BrokerData{
			{BrokerName: "b", Cluster: "c"},
			{BrokerName: "ü", Cluster: "c", BrokerAddrs: map[int64]string{10: "x:1", 2: "y:2"}, ZoneName: "z"},
		},
		FilterServerTable: map[string][]string{"h:1": {"f1", "f2"}},
	}
	got, _ := r.Encode()
	want := `{"brokerDatas":[{"brokerAddrs":{},"brokerName":"b","cluster":"c","enableActingMaster":false},` +
		`{"brokerAddrs":{"2":"y:2","10":"x:1"},"brokerName":"\u00fc","cluster":"c","enableActingMaster":false,"zoneName":"z"}],` +
		`"filterServerTable":{"h:1":["f1","f2"]},"orderTopicConf":"broker-a:4","queueDatas":[]}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if !json.Valid(got) || bytes.ContainsAny(got, " \n\t") {
		t.Fatal("not compact valid JSON")
	}
	var back TopicRouteData
	if err := back.Decode(got); err != nil || back.BrokerDatas[1].BrokerName != "ü" || back.OrderTopicConf != "broker-a:4" {
		t.Fatalf("%+v %v", back, err)
	}
	if e, _ := (&TopicRouteData{}).Encode(); string(e) != `{"brokerDatas":[],"filterServerTable":{},"queueDatas":[]}` {
		t.Fatal(string(e))
	}
}

func TestHeartbeatGoSample(t *testing.T) {
	var h HeartbeatData
	if err := h.Decode(readBody(t, "heartbeat_go.json")); err != nil {
		t.Fatal(err)
	}
	if h.ClientID != "10.0.0.5@12345" || len(h.ProducerDataSet) != 1 || h.ProducerDataSet[0].GroupName != "pg" {
		t.Fatalf("%+v", h)
	}
	cd := h.ConsumerDataSet[0]
	if cd.GroupName != "cg" || cd.ConsumeType != ConsumePassively || cd.MessageModel != MessageModelClustering ||
		cd.ConsumeFromWhere != ConsumeFromLastOffset || len(cd.SubscriptionDataSet) != 2 {
		t.Fatalf("%+v", cd)
	}
	s := cd.SubscriptionDataSet[0]
	if s.SubVersion != 1700000000000000000 || cd.SubscriptionDataSet[1].SubVersion != 1700000000000000001 {
		t.Fatalf("subVersion lost precision: %d", s.SubVersion)
	}
	want := NewTagSubscription("TopicTest", "TagA || TagB", 1700000000000000000)
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("subscription\n got %+v\nwant %+v", s, want)
	}
	retry := cd.SubscriptionDataSet[1]
	if retry.Topic != "%RETRY%cg" || retry.SubString != "*" || len(retry.CodeSet) != 0 || retry.TagsSet == nil {
		t.Fatalf("%+v", retry)
	}
	// Round trip through our encoding (codeSet as numbers).
	enc, err := h.Encode()
	if err != nil || !bytes.Contains(enc, []byte(`"codeSet":[2598919,2598920]`)) || !bytes.Contains(enc, []byte(`"subVersion":1700000000000000001`)) {
		t.Fatalf("%s %v", enc, err)
	}
	var back HeartbeatData
	if err := back.Decode(enc); err != nil || !reflect.DeepEqual(back, h) {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, back, h)
	}
	// Empty sets are [] not null.
	e, _ := (&HeartbeatData{ClientID: "x", ConsumerDataSet: []ConsumerData{{SubscriptionDataSet: []SubscriptionData{{}}}}}).Encode()
	if bytes.Contains(e, []byte("null")) {
		t.Fatal(string(e))
	}
	for _, bad := range []string{`{"consumerDataSet":[{"subscriptionDataSet":[{"codeSet":["x"]}]}]}`, `{"consumerDataSet":[{"subscriptionDataSet":[{"codeSet":[4294967296]}]}]}`, `{"consumerDataSet":[{"subscriptionDataSet":[{"subVersion":1.7e18}]}]}`} {
		if err := new(HeartbeatData).Decode([]byte(bad)); !errors.Is(err, ErrBodyInvalid) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestResetOffsetGolden(t *testing.T) {
	fast := readBody(t, "reset_offset_fastjson.txt")
	want := ResetOffsetBody{OffsetTable: map[MessageQueue]int64{
		{Topic: "topicB", BrokerName: "RaftNode00", QueueID: 1}: 0,
		{Topic: "topicB", BrokerName: "RaftNode00", QueueID: 0}: 11110,
	}}
	got, err := want.Encode()
	if err != nil || !bytes.Equal(got, fast) {
		t.Fatalf("encode:\n got %s\nwant %s", got, fast)
	}
	for _, name := range []string{"reset_offset_fastjson.txt", "reset_offset_gson.json"} {
		var r ResetOffsetBody
		if err := r.Decode(readBody(t, name)); err != nil || !reflect.DeepEqual(r, want) {
			t.Fatalf("%s: %+v %v", name, r, err)
		}
	}
}

func TestBodyGoldenRoundTrips(t *testing.T) {
	// Bodies whose Encode must reproduce the golden bytes exactly.
	exact := map[string]interface {
		Decode([]byte) error
		Encode() ([]byte, error)
	}{
		"register_broker.json": &RegisterBrokerBody{},
		"lock_response.json":   &LockBatchResponseBody{},
	}
	for name, v := range exact {
		golden := readBody(t, name)
		if err := v.Decode(golden); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := v.Encode()
		if err != nil || !bytes.Equal(got, golden) {
			t.Fatalf("%s:\n got %s\nwant %s", name, got, golden)
		}
	}

	var rb RegisterBrokerBody
	_ = rb.Decode(readBody(t, "register_broker.json"))
	if tc := rb.TopicConfigSerializeWrapper.TopicConfigTable["TBW102"]; tc.Perm != 7 || tc.ReadQueueNums != 8 || rb.TopicConfigSerializeWrapper.DataVersion.Counter != 3 {
		t.Fatalf("%+v", rb)
	}

	var ci ClusterInfo
	if err := ci.Decode(readBody(t, "cluster_info_fastjson.txt")); err != nil {
		t.Fatal(err)
	}
	if ci.BrokerAddrTable["broker-a"].MasterAddr() != "10.0.0.5:10911" || ci.ClusterAddrTable["DefaultCluster"][0] != "broker-a" {
		t.Fatalf("%+v", ci)
	}
	enc, _ := ci.Encode()
	if want := `{"brokerAddrTable":{"broker-a":{"brokerAddrs":{"0":"10.0.0.5:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}`; string(enc) != want {
		t.Fatal(string(enc))
	}

	cs := readBody(t, "consume_stats_fastjson.txt")
	var st ConsumeStats
	if err := st.Decode(cs); err != nil {
		t.Fatal(err)
	}
	if w := st.OffsetTable[MessageQueue{Topic: "t", BrokerName: "b"}]; w.BrokerOffset != 10 || w.ConsumerOffset != 8 || w.PullOffset != 9 {
		t.Fatalf("%+v", st)
	}
	if enc, _ := st.Encode(); !bytes.Equal(enc, cs) {
		t.Fatalf("consume stats:\n got %s\nwant %s", enc, cs)
	}

	var lr LockBatchRequestBody
	if err := lr.Decode(readBody(t, "lock_request.json")); err != nil {
		t.Fatal(err)
	}
	if lr.ConsumerGroup != "cg" || lr.ClientID != "10.0.0.5@12345" || lr.MQSet[0] != (MessageQueue{Topic: "t", BrokerName: "broker-a"}) {
		t.Fatalf("%+v", lr)
	}
	ul := UnlockBatchRequestBody(lr)
	enc, _ = ul.Encode()
	var ul2 UnlockBatchRequestBody
	if err := ul2.Decode(enc); err != nil || !reflect.DeepEqual(ul, ul2) {
		t.Fatalf("%+v %v", ul2, err)
	}
	var empty LockBatchResponseBody
	if err := empty.Decode(nil); err != nil || empty.LockOKMQSet != nil {
		t.Fatal("empty lock response means nothing locked")
	}
}

func TestSmallBodiesRoundTrip(t *testing.T) {
	type codec interface {
		Decode([]byte) error
		Encode() ([]byte, error)
	}
	cases := []struct {
		in, out codec
		want    string
	}{
		{&GetConsumerListByGroupResponseBody{ConsumerIDList: []string{"a@1", "b@2"}}, &GetConsumerListByGroupResponseBody{}, `{"consumerIdList":["a@1","b@2"]}`},
		{&GetConsumerListByGroupResponseBody{}, &GetConsumerListByGroupResponseBody{}, `{"consumerIdList":[]}`},
		{&KVTable{Table: map[string]string{"TopicA": "broker-a:8;broker-b:8"}}, &KVTable{}, `{"table":{"TopicA":"broker-a:8;broker-b:8"}}`},
		{&TopicList{TopicList: []string{"TopicTest", "TBW102"}}, &TopicList{}, `{"topicList":["TopicTest","TBW102"]}`},
		{&ConsumeMessageDirectlyResult{ConsumeResult: CMResultSuccess, AutoCommit: true, SpentTimeMills: 3}, &ConsumeMessageDirectlyResult{}, `{"autoCommit":true,"consumeResult":"CR_SUCCESS","order":false,"spentTimeMills":3}`},
	}
	for _, c := range cases {
		got, err := c.in.Encode()
		if err != nil || string(got) != c.want {
			t.Fatalf("encode %T: %s %v", c.in, got, err)
		}
		if err := c.out.Decode(got); err != nil {
			t.Fatal(err)
		}
		again, _ := c.out.Encode()
		if string(again) != c.want {
			t.Fatalf("%T round trip: %s", c.in, again)
		}
	}

	sg := SubscriptionGroupWrapper{SubscriptionGroupTable: map[string]SubscriptionGroupConfig{"cg": DefaultSubscriptionGroupConfig("cg")}}
	enc, err := sg.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var sg2 SubscriptionGroupWrapper
	if err := sg2.Decode(enc); err != nil || !reflect.DeepEqual(sg2.SubscriptionGroupTable, sg.SubscriptionGroupTable) {
		t.Fatalf("%s %v", enc, err)
	}
}

func TestConsumerRunningInfoTolerant(t *testing.T) {
	// Shape the Go client hand-builds: object keys in mqTable, numbers among
	// properties, whitespace.
	body := `{"properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY","PROP_THREADPOOL_CORE_SIZE":-1,"flag":true},
	"statusTable":{"t":{"pullRT":1.5,"pullTPS":2,"consumeRT":0,"consumeOKTPS":0,"consumeFailedTPS":0,"consumeFailedMsgs":3}},
	"subscriptionSet":[{"topic":"t","subString":"*","codeSet":[],"tagsSet":[],"subVersion":1}],
	"mqTable":{{"topic":"t","brokerName":"b","queueId":2}:{"commitOffset":7,"cachedMsgCount":1,"locked":true}}, "unknown":[1,2], "jstack":"x"}`
	var c ConsumerRunningInfo
	if err := c.Decode([]byte(body)); err != nil {
		t.Fatal(err)
	}
	q := c.MQTable[MessageQueue{Topic: "t", BrokerName: "b", QueueID: 2}]
	if q.CommitOffset != 7 || !q.Locked || c.Properties["PROP_THREADPOOL_CORE_SIZE"] != "-1" || c.Properties["flag"] != "true" ||
		c.StatusTable["t"].ConsumeFailedMsgs != 3 || c.Jstack != "x" || len(c.SubscriptionSet) != 1 {
		t.Fatalf("%+v", c)
	}
	enc, err := c.Encode()
	if err != nil || !bytes.Contains(enc, []byte(`"mqTable":{{"brokerName":"b","queueId":2,"topic":"t"}:{`)) {
		t.Fatalf("%s %v", enc, err)
	}
	var back ConsumerRunningInfo
	if err := back.Decode(enc); err != nil || !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip %v\n%+v\n%+v", err, back, c)
	}
}

func TestRegisterBrokerCompressed(t *testing.T) {
	var rb RegisterBrokerBody
	if err := rb.Decode(readBody(t, "register_broker.json")); err != nil {
		t.Fatal(err)
	}
	rb.TopicConfigSerializeWrapper.TopicConfigTable["TopicTest"] = TopicConfig{TopicName: "TopicTest", ReadQueueNums: 4, WriteQueueNums: 4,
		Perm: 6, TopicFilterType: TopicFilterSingleTag, Attributes: map[string]string{"+message.type": "NORMAL"}}
	z, err := rb.EncodeCompressed()
	if err != nil {
		t.Fatal(err)
	}
	var back RegisterBrokerBody
	if err := back.DecodeCompressed(z, 0); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.TopicConfigSerializeWrapper.TopicConfigTable, rb.TopicConfigSerializeWrapper.TopicConfigTable) ||
		back.TopicConfigSerializeWrapper.DataVersion != rb.TopicConfigSerializeWrapper.DataVersion || back.FilterServerList == nil {
		t.Fatalf("%+v", back)
	}
	if err := back.DecodeCompressed(z, 10); !errors.Is(err, ErrBodyInvalid) {
		t.Fatalf("bound: %v", err)
	}
	trunc, _ := Compress(nil, []byte{0, 0, 0, 5, '{', '}'}, 5)
	if err := back.DecodeCompressed(trunc, 0); !errors.Is(err, ErrBodyInvalid) {
		t.Fatalf("truncated: %v", err)
	}
	if _, err := ParseTopicConfigText("t 1 x 6 SINGLE_TAG"); !errors.Is(err, ErrBodyInvalid) {
		t.Fatal(err)
	}
}

func TestNormalizeJSON(t *testing.T) {
	cases := map[string]string{
		`{0:"a:1", 1 : "b:2"}`:                           `{"0":"a:1","1":"b:2"}`,
		`{ {"b":"x", "q":0}:42 ,{"b":"y"}:{"z":[1, 2]}}`: `{"{\"b\":\"x\",\"q\":0}":42,"{\"b\":\"y\"}":{"z":[1,2]}}`,
		`[ ]`: `[]`, `{}`: `{}`, `"a\" b"`: `"a\" b"`, `-1.5e+3`: `-1.5e+3`, `{[1,2]:true}`: `{"[1,2]":true}`,
		`{"k":null,abc_1:false}`: `{"k":null,"abc_1":false}`,
		`{{"n":"é"}:1}`:          `{"{\"n\":\"\u00e9\"}":1}`,
	}
	for in, want := range cases {
		got, err := NormalizeJSON(nil, []byte(in))
		if err != nil || string(got) != want {
			t.Errorf("%s: got %s (%v), want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a"}`, `{"a":}`, `[1,]`, `{,}`, `"abc`, `01`, `1.`, `tru`, `{"a":1}x`, `{'a':1}`, `[1 2]`, `nul`, `-`, `{a:NaN}`} {
		if _, err := NormalizeJSON(nil, []byte(bad)); !errors.Is(err, ErrBodyInvalid) {
			t.Errorf("%q accepted", bad)
		}
	}
	deep := strings.Repeat("[", MaxJSONDepth+2) + strings.Repeat("]", MaxJSONDepth+2)
	if _, err := NormalizeJSON(nil, []byte(deep)); !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("depth: %v", err)
	}
	big := make([]byte, MaxBodySize+1)
	if err := new(TopicList).Decode(big); !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("size: %v", err)
	}
	many := "[" + strings.Repeat("0,", MaxJSONValues) + "0]"
	if _, err := NormalizeJSON(nil, []byte(many)); !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("count: %v", err)
	}
}

func FuzzNonStandardJSON(f *testing.F) {
	for _, name := range []string{"route_fastjson.json", "route_whitespace.json", "reset_offset_fastjson.txt", "consume_stats_fastjson.txt", "heartbeat_go.json"} {
		f.Add(readBody(f, name))
	}
	f.Add([]byte(`{{"a":{1:[{}]}}:{2:3}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := NormalizeJSON(nil, b)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			// Strings are copied verbatim, so invalid escapes or control
			// characters inside them survive; anything else must be valid.
			if !bytes.Contains(b, []byte{'"'}) {
				t.Fatalf("invalid output %q from %q", out, b)
			}
			return
		}
		again, err := NormalizeJSON(nil, out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q (%v)", out, again, err)
		}
	})
}

func FuzzRouteData(f *testing.F) {
	for _, name := range []string{"route_standard.json", "route_fastjson.json", "route_whitespace.json"} {
		f.Add(readBody(f, name))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r TopicRouteData
		if err := r.Decode(b); err != nil {
			return
		}
		enc, err := r.Encode()
		if err != nil || !json.Valid(enc) {
			t.Fatalf("encode: %s %v", enc, err)
		}
		var r2 TopicRouteData
		if err := r2.Decode(enc); err != nil {
			t.Fatalf("decode of encode: %v\n%s", err, enc)
		}
		enc2, _ := r2.Encode()
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("not stable:\n%s\n%s", enc, enc2)
		}
	})
}

func FuzzHeartbeat(f *testing.F) {
	f.Add(readBody(f, "heartbeat_go.json"))
	f.Add([]byte(`{"clientID":"x","consumerDataSet":[{"subscriptionDataSet":[{"codeSet":[1,"2"]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h HeartbeatData
		if err := h.Decode(b); err != nil {
			return
		}
		enc, err := h.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var h2 HeartbeatData
		if err := h2.Decode(enc); err != nil {
			t.Fatalf("decode of encode: %v", err)
		}
		enc2, _ := h2.Encode()
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("not stable:\n%s\n%s", enc, enc2)
		}
	})
}

func BenchmarkRouteData(b *testing.B) {
	body := readBody(b, "route_fastjson.json")
	r := wantRoute()
	b.Run("encode", func(b *testing.B) {
		buf := make([]byte, 0, 512)
		b.ReportAllocs()
		for b.Loop() {
			buf = r.AppendTo(buf[:0])
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var d TopicRouteData
			if err := d.Decode(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
