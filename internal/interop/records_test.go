package interop

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// hostString formats ap as the official client does ("ip:port", IPv6
// without brackets).
func hostString(ap netip.AddrPort) string {
	return fmt.Sprintf("%s:%d", ap.Addr().Unmap().String(), ap.Port())
}

// props builds a raw properties string from name/value pairs, in order.
func props(kv ...string) string {
	var b []byte
	for i := 0; i < len(kv); i += 2 {
		b = protocol.AppendProperty(b, kv[i], kv[i+1])
	}
	return string(b)
}

// recordCases are stored records covering the layout's variants: IPv4 and
// IPv6 hosts, empty and large bodies, a zlib-compressed body, with and
// without UNIQ_KEY, negative and extreme numbers, the longest V1 topic.
func recordCases(t *testing.T) []protocol.MessageExt {
	t.Helper()
	big := bytes.Repeat([]byte("runnel "), 1200)
	compressed, err := protocol.Compress(nil, big, 5)
	if err != nil {
		t.Fatal(err)
	}
	return []protocol.MessageExt{
		{ // the worked example of the protocol reference, appendix A.1
			QueueID: 1, QueueOffset: 5, CommitLogOffset: 0x1234,
			BornTimestamp: 1700000000000, BornHost: netip.MustParseAddrPort("10.0.0.9:54321"),
			StoreTimestamp: 1700000000100, StoreHost: netip.MustParseAddrPort("10.0.0.5:10911"),
			Body: []byte("hello"), Topic: "TopicTest",
			Properties: props("TAGS", "TagA", "UNIQ_KEY", "0A0000090001000000000000DEAD0001", "CLUSTER", "DefaultCluster"),
		},
		{ // IPv6 born and store hosts, no UNIQ_KEY, keys and flags
			QueueID: 7, Flag: -1, QueueOffset: 1<<62 + 3, CommitLogOffset: 1 << 40, SysFlag: protocol.SysFlagTransactionCommit,
			BornTimestamp: 1, BornHost: netip.MustParseAddrPort("[2001:db8::1]:65535"),
			StoreTimestamp: 2, StoreHost: netip.MustParseAddrPort("[fe80::abcd:1]:10911"),
			ReconsumeTimes: 16, PreparedTransactionOffset: 987654321,
			Body: []byte{0, 1, 2, 3}, Topic: "%RETRY%group",
			Properties: props("KEYS", "order-1 order-2", "TAGS", "TagB", "RETRY_TOPIC", "T"),
		},
		{ // empty body, no properties, mixed host families
			BornHost: netip.MustParseAddrPort("[2001:db8::2]:1"), StoreHost: netip.MustParseAddrPort("192.168.1.1:2"),
			Topic: "t",
		},
		{ // compressed body: the official decoder inflates it
			QueueID: 2, QueueOffset: 9, CommitLogOffset: 77, SysFlag: protocol.SysFlagCompressed,
			BornHost: netip.MustParseAddrPort("10.1.1.1:1000"), StoreHost: netip.MustParseAddrPort("10.1.1.2:2000"),
			Body: compressed, Topic: "Compressed", Properties: props("TAGS", "zip"),
		},
		{ // the longest topic a V1 record holds (the official decoder reads a 1-byte length)
			BornHost: netip.MustParseAddrPort("1.2.3.4:5"), StoreHost: netip.MustParseAddrPort("6.7.8.9:10"),
			Body: bytes.Repeat([]byte{0xAB}, 1024), Topic: strings.Repeat("x", protocol.MaxTopicLengthV1),
			Properties: props("UNIQ_KEY", "C0000202664A00000000962a81400001"),
		},
	}
}

// TestRecordsDecodeWithOfficial encodes records with runnel's AppendRecord,
// concatenated as in a PULL_MESSAGE body, and decodes them with the official
// primitive.DecodeMessage: every field must come back.
func TestRecordsDecodeWithOfficial(t *testing.T) {
	cases := recordCases(t)
	var body []byte
	for i := range cases {
		var err error
		if body, err = cases[i].AppendRecord(body); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
	}
	got := primitive.DecodeMessage(body)
	if len(got) != len(cases) {
		t.Fatalf("official decoder found %d records, want %d", len(got), len(cases))
	}
	for i, m := range cases {
		o := got[i]
		wantBody := m.Body
		if m.Compressed() {
			var err error
			if wantBody, err = m.DecompressedBody(1 << 20); err != nil {
				t.Fatal(err)
			}
		}
		size, _, _ := m.RecordSize()
		wantSys := m.SysFlag
		if m.BornHost.Addr().Is6() {
			wantSys |= protocol.SysFlagBornHostV6
		}
		if m.StoreHost.Addr().Is6() {
			wantSys |= protocol.SysFlagStoreHostV6
		}
		checks := []struct {
			name      string
			got, want any
		}{
			{"StoreSize", o.StoreSize, int32(size)},
			{"BodyCRC", o.BodyCRC, protocol.BodyCRC(m.Body)},
			{"QueueId", o.Queue.QueueId, int(m.QueueID)},
			{"Flag", o.Flag, m.Flag},
			{"QueueOffset", o.QueueOffset, m.QueueOffset},
			{"CommitLogOffset", o.CommitLogOffset, m.CommitLogOffset},
			{"SysFlag", o.SysFlag, wantSys},
			{"BornTimestamp", o.BornTimestamp, m.BornTimestamp},
			{"BornHost", o.BornHost, hostString(m.BornHost)},
			{"StoreTimestamp", o.StoreTimestamp, m.StoreTimestamp},
			{"StoreHost", o.StoreHost, hostString(m.StoreHost)},
			{"ReconsumeTimes", o.ReconsumeTimes, m.ReconsumeTimes},
			{"PreparedTransactionOffset", o.PreparedTransactionOffset, m.PreparedTransactionOffset},
			{"Body", string(o.Body), string(wantBody)},
			{"Topic", o.Topic, m.Topic},
			{"Tags", o.GetTags(), m.Tags()},
			{"Keys", o.GetKeys(), m.Keys()},
			{"OffsetMsgId", o.OffsetMsgId, m.OffsetMsgID()},
			{"MsgId", o.MsgId, m.MsgID()},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("case %d %s: official %v, runnel %v", i, c.name, c.got, c.want)
			}
		}
		if op, rp := o.GetProperties(), protocol.ParseProperties(m.Properties); !maps.Equal(op, rp) {
			t.Errorf("case %d properties: official %q, runnel %q", i, op, rp)
		}
		// And runnel's own decoder agrees with itself on the same bytes.
		back, n, err := protocol.DecodeRecord(body)
		if err != nil || n != size {
			t.Fatalf("case %d: runnel DecodeRecord: n=%d err=%v", i, n, err)
		}
		if back.Topic != m.Topic || !bytes.Equal(back.Body, m.Body) || back.Properties != m.Properties {
			t.Errorf("case %d: runnel round trip differs", i)
		}
		body = body[n:]
	}
}

// TestBatchMatchesOfficial compares batch bodies (SEND_BATCH_MESSAGE): for
// messages with at most one property the official encoding is deterministic
// and runnel's AppendBatchItem must produce the same bytes; with more
// properties (map order) runnel's DecodeBatch must read the official body.
func TestBatchMatchesOfficial(t *testing.T) {
	type msg struct {
		flag  int32
		body  []byte
		props [][2]string
	}
	msgs := []msg{
		{0, []byte("ab"), [][2]string{{"TAGS", "T"}}}, // the worked example of §4.4
		{-7, nil, nil},
		{1 << 30, bytes.Repeat([]byte{9}, 1024), [][2]string{{"KEYS", "k"}}},
		{3, []byte("multi"), [][2]string{{"TAGS", "T"}, {"KEYS", "a b"}, {"DELAY", "3"}, {"UNIQ_KEY", "X"}}},
	}
	var official []*primitive.Message
	var runnel []byte
	for _, m := range msgs {
		om := primitive.NewMessage("TopicTest", m.body)
		om.Flag = m.flag
		var raw []byte
		for _, p := range m.props {
			om.WithProperty(p[0], p[1])
			raw = protocol.AppendProperty(raw, p[0], p[1])
		}
		official = append(official, om)
		var err error
		if runnel, err = protocol.AppendBatchItem(runnel, m.flag, m.body, string(raw)); err != nil {
			t.Fatal(err)
		}
		if len(m.props) <= 1 {
			if got := om.Marshal(); !bytes.Equal(got, runnel[len(runnel)-len(got):]) {
				t.Errorf("batch item %+v: official % x, runnel % x", m, got, runnel[len(runnel)-len(got):])
			}
		}
	}
	if got := protocol.BatchItemSize(msgs[0].body, "TAGS\x01T\x02"); got != 31 {
		t.Errorf("BatchItemSize of the §4.4 example = %d, want 31", got)
	}
	body := producer.MarshalMessageBatch(official...)
	if len(body) != len(runnel) {
		t.Errorf("official batch %d bytes, runnel %d", len(body), len(runnel))
	}
	i := 0
	err := protocol.DecodeBatch(body, 0, func(flag int32, b []byte, p string) error {
		if i >= len(msgs) {
			return fmt.Errorf("extra item %d", i)
		}
		want := map[string]string{}
		for _, kv := range msgs[i].props {
			want[kv[0]] = kv[1]
		}
		if flag != msgs[i].flag || !bytes.Equal(b, msgs[i].body) || !maps.Equal(protocol.ParseProperties(p), want) {
			t.Errorf("item %d: flag %d body %q props %q", i, flag, b, p)
		}
		i++
		return nil
	})
	if err != nil || i != len(msgs) {
		t.Fatalf("runnel DecodeBatch of the official batch: %d items, %v", i, err)
	}
}

// TestPropertiesMatchOfficial checks properties strings both ways, and pins
// the two places where the parsers knowingly differ (runnel follows Java).
func TestPropertiesMatchOfficial(t *testing.T) {
	m := map[string]string{
		"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "C0000202664A00000000962a81400001",
		"DELAY": "3", "custom key": "välue with spaces", "CLUSTER": "DefaultCluster",
	}
	// official → runnel
	om := primitive.NewMessage("t", nil)
	om.WithProperties(maps.Clone(m))
	if got := protocol.ParseProperties(om.MarshallProperties()); !maps.Equal(got, m) {
		t.Errorf("runnel parsed the official string to %q, want %q", got, m)
	}
	raw := om.MarshallProperties()
	for k, v := range m {
		if got, ok := protocol.PropertyValue(raw, k); !ok || got != v {
			t.Errorf("PropertyValue(official, %q) = %q, %v", k, got, ok)
		}
	}
	if err := protocol.ValidateProperties(raw); err != nil {
		t.Errorf("ValidateProperties(official string): %v", err)
	}
	// runnel → official
	rs := protocol.AppendProperties(nil, m)
	var back primitive.Message
	back.UnmarshalProperties(rs)
	if got := back.GetProperties(); !maps.Equal(got, m) {
		t.Errorf("official parsed runnel's string to %q, want %q", got, m)
	}
	// A single pair is deterministic: byte-identical.
	one := primitive.NewMessage("t", nil)
	one.WithTag("TagA")
	if got, want := one.MarshallProperties(), props("TAGS", "TagA"); got != want {
		t.Errorf("one property: official %q, runnel %q", got, want)
	}

	// Known differences. An empty value: the Java parser (and runnel) drops
	// the pair, the official Go parser keeps it with an empty value.
	var o1 primitive.Message
	o1.UnmarshalProperties([]byte("A\x01\x02B\x01b\x02"))
	if got := o1.GetProperties(); !maps.Equal(got, map[string]string{"A": "", "B": "b"}) {
		t.Errorf("official parse of an empty value: %q (behaviour changed: update the report)", got)
	}
	if got := protocol.ParseProperties("A\x01\x02B\x01b\x02"); !maps.Equal(got, map[string]string{"B": "b"}) {
		t.Errorf("runnel parse of an empty value: %q", got)
	}
	// A value containing \x01: Java (and runnel) split at the first \x01 and
	// keep the rest; the official Go parser drops the pair.
	var o2 primitive.Message
	o2.UnmarshalProperties([]byte("A\x01x\x01y\x02B\x01b\x02"))
	if got := o2.GetProperties(); !maps.Equal(got, map[string]string{"B": "b"}) {
		t.Errorf("official parse of a value with \\x01: %q (behaviour changed: update the report)", got)
	}
	if got := protocol.ParseProperties("A\x01x\x01y\x02B\x01b\x02"); !maps.Equal(got, map[string]string{"A": "x\x01y", "B": "b"}) {
		t.Errorf("runnel parse of a value with \\x01: %q", got)
	}
}

// TestOffsetMsgIDMatchesOfficial compares offset message ids both ways for
// IPv4 and IPv6 store hosts.
func TestOffsetMsgIDMatchesOfficial(t *testing.T) {
	for _, c := range []struct {
		host string
		off  int64
	}{
		{"10.0.0.5:10911", 0x2A},
		{"255.255.255.255:65535", 1<<63 - 1},
		{"0.0.0.0:0", 0},
		{"[2001:db8::5]:10911", 123456789},
	} {
		ap := netip.MustParseAddrPort(c.host)
		ip := ap.Addr().AsSlice()
		ours := protocol.OffsetMsgID(ap, c.off)
		theirs := primitive.CreateMessageId(ip, int32(ap.Port()), c.off)
		if ours != theirs {
			t.Errorf("%s/%d: runnel %s, official %s", c.host, c.off, ours, theirs)
		}
		gotAP, gotOff, err := protocol.ParseOffsetMsgID(theirs)
		if err != nil || gotAP != ap || gotOff != c.off {
			t.Errorf("runnel ParseOffsetMsgID(%s) = %v, %d, %v", theirs, gotAP, gotOff, err)
		}
		id, err := primitive.UnmarshalMsgID([]byte(ours))
		if err != nil {
			t.Errorf("official UnmarshalMsgID(%s): %v", ours, err)
			continue
		}
		wantAddr := ap.Addr().String()
		if ap.Addr().Is6() {
			wantAddr = "[" + wantAddr + "]"
		}
		if id.Addr != wantAddr || id.Port != int(ap.Port()) || id.Offset != c.off {
			t.Errorf("official UnmarshalMsgID(%s) = %+v", ours, id)
		}
	}
}
