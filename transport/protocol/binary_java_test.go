package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
)

// Facts about Apache RocketMQ's Java handling of the ROCKETMQ binary header
// (serialize type 1) that these tests hold runnel to. Versions are
// apache/rocketmq release tags; classes are in org.apache.rocketmq.remoting.protocol.
//
// J1 Encoding (RocketMQSerializable.rocketMQProtocolEncode, both the byte[]
//    and the ByteBuf overload, and mapSerialize; 4.9.x and 5.x alike): code
//    and version as 16-bit shorts, language as one byte, opaque and flag as
//    int32; the remark as int32 length 0 when it is null or empty, else its
//    length and UTF-8 bytes; then an int32 extFields length (0 for a null or
//    empty map) and per entry with a non-null key and value: int16 key
//    length, key, int32 value length, value. An empty, non-null value is
//    written with length 0, not skipped; only null values are skipped (as
//    FastCodesHeader.writeIfNotNull does in 5.x).
// J2 Decoding, 4.9.4 to 5.3.3 (RocketMQSerializable.readStr, introduced by
//    "[ISSUE 3585] [Part B] Improve encode/decode performance"): a string of
//    length 0 reads as null, so an empty remark, key or extFields value
//    arrives as null: for a value, HashMap.get answers null, exactly as for
//    an absent key.
// J3 Decoding, 4.9.3 and earlier (mapDeserialize(byte[])): an empty
//    extFields value reads as "", as it does from JSON; an empty remark is
//    left null.
// J4 rocketMQProtocolDecode (every version): an extFields length of 0 leaves
//    the command's extFields null (not an empty map).
// J5 RemotingCommand.decode(ByteBuf) (4.9.4 to 5.3.3): the body is read from
//    where the header decode stopped, so the header must be exactly
//    headerLength bytes long; a key length is a signed short and a length
//    above the header (remark) or extFields (entries) length is refused.
//
// Consequence for runnel (not testable here, noted for readers): Java's
// header decoders (RemotingCommand.decodeCommandCustomHeader and
// FastCodesHeader.getAndCheckNotNull, 4.9.x and 5.x) only log a null
// @CFNotNull field, they do not throw; but Java's ACL servers
// (PlainAccessValidator.parse in 4.9.x, DefaultAuthenticationContextBuilder
// in 5.x, both through AclUtils.combineRequestContent) append every
// extFields value, a null one as the text "null", to the signed content.
// A signed binary request with an empty value therefore fails the signature
// check of a Java 4.9.4+ server; runnel's client sends none (its required
// strings are validated non-empty and empty optional ones are omitted).

// jstr is a Java String: ok false is null.
type jstr struct {
	s  string
	ok bool
}

func jval(s string) jstr { return jstr{s, true} }

func (j jstr) String() string {
	if !j.ok {
		return "null"
	}
	return fmt.Sprintf("%q", j.s)
}

// javaCommand is what Java's RemotingCommand holds after decoding a binary
// header.
type javaCommand struct {
	code     int16
	language byte
	version  int16
	opaque   int32
	flag     int32
	remark   jstr
	ext      map[jstr]jstr // nil: extFields null (J4)
	body     []byte
}

// javaDecodeFrame decodes frame (with its total-length word) as Java's
// RemotingCommand.decode does with a ROCKETMQ header (J1-J5): the 4.9.4+
// decoder, or with pre494 the 4.9.3 one. Strings are kept as bytes (runnel
// tests use valid UTF-8 only, which Java's UTF-8 decoder keeps as is).
func javaDecodeFrame(frame []byte, pre494 bool) (javaCommand, error) {
	var jc javaCommand
	if len(frame) < 8 {
		return jc, errors.New("short frame")
	}
	length := int(binary.BigEndian.Uint32(frame)) // readableBytes after the length word
	if length != len(frame)-4 {
		return jc, fmt.Errorf("length word %d, %d bytes follow", length, len(frame)-4)
	}
	word := binary.BigEndian.Uint32(frame[4:])
	if word>>24 != uint32(SerializeRocketMQ) {
		return jc, fmt.Errorf("serialize type %d", word>>24)
	}
	headerLen := int(word & 0xFFFFFF)
	if headerLen > length-4 {
		return jc, fmt.Errorf("bad header length %d", headerLen)
	}
	r := &javaBuf{b: frame[8:]}
	jc.code = int16(r.u16())
	jc.language = r.u8()
	jc.version = int16(r.u16())
	jc.opaque = int32(r.u32())
	jc.flag = int32(r.u32())
	if pre494 {
		if n := int(int32(r.u32())); n > 0 {
			jc.remark = jval(string(r.take(n)))
		}
	} else {
		jc.remark = r.readStr(false, headerLen)
	}
	extLen := int(int32(r.u32()))
	if extLen > 0 {
		if extLen > headerLen {
			return jc, fmt.Errorf("extFields length %d, header length %d", extLen, headerLen)
		}
		jc.ext = map[jstr]jstr{}
		end := r.pos + extLen
		for r.err == nil && r.pos < end {
			if pre494 {
				k := string(r.take(int(int16(r.u16()))))
				v := string(r.take(int(int32(r.u32()))))
				jc.ext[jval(k)] = jval(v)
				continue
			}
			k := r.readStr(true, extLen)
			v := r.readStr(false, extLen)
			jc.ext[k] = v
		}
	}
	if r.err != nil {
		return jc, r.err
	}
	// J5: the body starts where the header decode stopped.
	if bodyLen := length - 4 - headerLen; bodyLen > 0 {
		jc.body = r.take(bodyLen)
	}
	if r.err != nil {
		return jc, r.err
	}
	if r.pos != len(r.b) {
		return jc, fmt.Errorf("%d bytes left after the body", len(r.b)-r.pos)
	}
	return jc, nil
}

// javaBuf reads like a Netty ByteBuf: out-of-range reads fail.
type javaBuf struct {
	b   []byte
	pos int
	err error
}

func (r *javaBuf) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.pos {
		r.err = fmt.Errorf("read of %d bytes at %d of %d", n, r.pos, len(r.b))
		return nil
	}
	p := r.b[r.pos : r.pos+n]
	r.pos += n
	return p
}

func (r *javaBuf) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *javaBuf) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *javaBuf) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// readStr is RocketMQSerializable.readStr of 4.9.4 to 5.3.3 (J2, J5).
func (r *javaBuf) readStr(short bool, limit int) jstr {
	var n int
	if short {
		n = int(int16(r.u16()))
	} else {
		n = int(int32(r.u32()))
	}
	if r.err != nil || n == 0 {
		return jstr{}
	}
	if n > limit {
		r.err = fmt.Errorf("string length %d exceeds limit %d", n, limit)
		return jstr{}
	}
	return jval(string(r.take(n)))
}

// javaView is what a Java peer's extFields map holds for c's fields: an
// empty value is null from 4.9.4 on (J2), "" before (J3); the last of a
// repeated key wins (HashMap.put). nil when c has none (J4).
func javaView(c *Command, pre494 bool) map[jstr]jstr {
	if c.NumExt() == 0 {
		return nil
	}
	m := map[jstr]jstr{}
	for i := range c.NumExt() {
		f := c.ExtAt(i)
		k, v := jval(f.Key), jval(f.Value)
		if !pre494 {
			if f.Key == "" {
				k = jstr{}
			}
			if f.Value == "" {
				v = jstr{}
			}
		}
		m[k] = v
	}
	return m
}

func sameJavaMap(a, b map[jstr]jstr) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// binaryJavaCases are commands as runnel's client and broker build them,
// plus the edge values of each header field.
func binaryJavaCases(t *testing.T) []struct {
	name string
	c    *Command
} {
	t.Helper()
	withHeader := func(code int32, h CustomHeader) *Command {
		c := NewRequest(code)
		c.Language, c.Version = LanguageGo, CurrentVersion
		h.Encode(c)
		return c
	}
	send := SendMessageRequestHeaderV2{
		ProducerGroup: "pg", Topic: "TopicTest", DefaultTopic: "TBW102", DefaultTopicQueueNums: 4,
		QueueID: 3, SysFlag: 0, BornTimestamp: 1700000000123, Flag: 0,
		Properties:     "UNIQ_KEY\x01AC1100020000\x02TAGS\x01tag-é\x02",
		ReconsumeTimes: Some[int32](0), UnitMode: Some(false), BrokerName: "broker-a",
	}
	batch := send
	batch.Properties, batch.Batch = "", Some(true)
	reencoded := func() *Command {
		// A decoded binary header re-encoded from its unsplit section.
		f, err := withHeader(ReqPullMessage, &PullMessageRequestHeader{ConsumerGroup: "cg", Topic: "T",
			QueueID: 1, QueueOffset: 42, MaxMsgNums: 32, SysFlag: 2, SuspendTimeoutMillis: 15000,
			Subscription: "*", ExpressionType: "TAG", BrokerName: "broker-a"}).AppendFrame(nil, SerializeRocketMQ)
		if err != nil {
			t.Fatal(err)
		}
		c, err := DecodeFrame(f[4:])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}()
	edges := NewResponse(&Command{Opaque: -5}, -1, "")
	edges.Language, edges.Version = LanguageNodeJS, math16Max
	edges.Flag |= FlagOneway
	edges.appendExt("", "")
	edges.appendExt("empty", "")
	edges.appendExt("k", "v1")
	edges.appendExt("k", "v2-é😀")
	remark := NewResponse(&Command{Opaque: 9}, 17, "topic[T] not exist, apply first please! é")
	remark.Body = []byte("body")
	return []struct {
		name string
		c    *Command
	}{
		{"send v2", withHeader(ReqSendMessageV2, &send)},
		{"send batch, no properties", withHeader(ReqSendBatchMessage, &batch)},
		{"route", withHeader(ReqGetRouteInfoByTopic, &GetRouteInfoRequestHeader{Topic: "T", AcceptStandardJSONOnly: Some(true)})},
		{"end transaction", withHeader(ReqEndTransaction, &EndTransactionRequestHeader{ProducerGroup: "pg",
			TranStateTableOffset: 7, CommitLogOffset: 1234, CommitOrRollback: 8, FromTransactionCheck: Some(false),
			MsgID: "AC11000200002A9F0000000000000001", TransactionID: "tx", BrokerName: "broker-a"})},
		{"end transaction, empty msgId", withHeader(ReqEndTransaction, &EndTransactionRequestHeader{ProducerGroup: "pg",
			CommitOrRollback: 12})},
		{"heartbeat", func() *Command { c := NewRequest(ReqHeartbeat); c.Body = []byte(`{"clientID":"x"}`); return c }()},
		{"re-encoded unsplit", reencoded},
		{"edges", edges},
		{"remark", remark},
	}
}

const math16Max = 1<<15 - 1

// TestBinaryHeaderAsJavaDecodesIt encodes runnel commands and decodes the
// bytes as Java does (J1-J5): Java must consume exactly the header and find
// the body after it, every fixed field and the remark intact, and the
// extFields map runnel meant, an empty value read back as null by 4.9.4+
// and as "" by 4.9.3.
func TestBinaryHeaderAsJavaDecodesIt(t *testing.T) {
	for _, tc := range binaryJavaCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			frame, err := tc.c.AppendFrame(nil, SerializeRocketMQ)
			if err != nil {
				t.Fatal(err)
			}
			for _, pre494 := range []bool{false, true} {
				jc, err := javaDecodeFrame(frame, pre494)
				if err != nil {
					t.Fatalf("pre494=%v: Java decode: %v\n%s", pre494, err, hex.Dump(frame))
				}
				c := tc.c
				if int32(jc.code) != c.Code || jc.language != byte(c.Language) || int32(jc.version) != c.Version ||
					jc.opaque != c.Opaque || jc.flag != c.Flag || !bytes.Equal(jc.body, c.Body) {
					t.Fatalf("pre494=%v: Java read code %d lang %d ver %d opaque %d flag %d body %q from %s",
						pre494, jc.code, jc.language, jc.version, jc.opaque, jc.flag, jc.body, dumpCommand(c))
				}
				// The remark: null when empty in every version.
				if wantRemark := (jstr{c.Remark, c.Remark != ""}); jc.remark != wantRemark {
					t.Fatalf("pre494=%v: remark %v, want %v", pre494, jc.remark, wantRemark)
				}
				if want := javaView(c, pre494); !sameJavaMap(jc.ext, want) {
					t.Fatalf("pre494=%v: Java extFields %v, want %v", pre494, jc.ext, want)
				}
			}
		})
	}
}

// TestBinaryRequiredFieldsReachJava checks, for the request headers runnel's
// client sends, with the values it sends, that a Java 4.9.4+ decoder sees
// every required field: the non-null entries of the map Java reads satisfy
// the header's own required-field check. An empty required string is the
// one thing that does not survive (J2): it arrives as null, as if absent,
// where the JSON encoding delivers "".
func TestBinaryRequiredFieldsReachJava(t *testing.T) {
	for _, tc := range []struct {
		name    string
		code    int32
		h       CustomHeader
		fresh   func() CustomHeader
		missing string // the required key Java sees null, if any
	}{
		{"send v2", ReqSendMessageV2, &SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: "T", DefaultTopic: "TBW102",
			DefaultTopicQueueNums: 4, QueueID: 0, BornTimestamp: 1, Properties: "UNIQ_KEY\x01X\x02", BrokerName: "b"},
			func() CustomHeader { return new(SendMessageRequestHeaderV2) }, ""},
		{"pull", ReqPullMessage, &PullMessageRequestHeader{ConsumerGroup: "cg", Topic: "T", MaxMsgNums: 32,
			Subscription: "*", ExpressionType: "TAG", BrokerName: "b"}, func() CustomHeader { return new(PullMessageRequestHeader) }, ""},
		{"query offset", ReqQueryConsumerOffset, &QueryConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "T",
			SetZeroIfNotFound: Some(false), BrokerName: "b"}, func() CustomHeader { return new(QueryConsumerOffsetRequestHeader) }, ""},
		{"commit offset", ReqUpdateConsumerOffset, &UpdateConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "T",
			CommitOffset: 5, BrokerName: "b"}, func() CustomHeader { return new(UpdateConsumerOffsetRequestHeader) }, ""},
		{"create topic", ReqUpdateAndCreateTopic, &CreateTopicRequestHeader{Topic: "T", DefaultTopic: "TBW102",
			ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6, TopicFilterType: TopicFilterSingleTag},
			func() CustomHeader { return new(CreateTopicRequestHeader) }, ""},
		{"search offset", ReqSearchOffsetByTimestamp, &SearchOffsetRequestHeader{Topic: "T", Timestamp: 1},
			func() CustomHeader { return new(SearchOffsetRequestHeader) }, ""},
		{"unregister", ReqUnregisterClient, &UnregisterClientRequestHeader{ClientID: "10.0.0.1@1", ConsumerGroup: "cg"},
			func() CustomHeader { return new(UnregisterClientRequestHeader) }, ""},
		{"delete topic in namesrv", ReqDeleteTopicInNamesrv, &DeleteTopicFromNamesrvRequestHeader{Topic: "T"},
			func() CustomHeader { return new(DeleteTopicFromNamesrvRequestHeader) }, ""},
		{"consume stats", ReqGetConsumeStats, &GetConsumeStatsRequestHeader{ConsumerGroup: "cg"},
			func() CustomHeader { return new(GetConsumeStatsRequestHeader) }, ""},
		{"end transaction, empty msgId", ReqEndTransaction, &EndTransactionRequestHeader{ProducerGroup: "pg", CommitOrRollback: 8},
			func() CustomHeader { return new(EndTransactionRequestHeader) }, "msgId"},
		{"consumer list, empty group", ReqGetConsumerListByGroup, &GetConsumerListByGroupRequestHeader{},
			func() CustomHeader { return new(GetConsumerListByGroupRequestHeader) }, "consumerGroup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewRequest(tc.code)
			tc.h.Encode(c)
			// Runnel's own decoder takes the empty value as present.
			if err := tc.fresh().Decode(c); err != nil {
				t.Fatalf("runnel decode of its own header: %v", err)
			}
			frame, err := c.AppendFrame(nil, SerializeRocketMQ)
			if err != nil {
				t.Fatal(err)
			}
			jc, err := javaDecodeFrame(frame, false)
			if err != nil {
				t.Fatal(err)
			}
			seen := NewRequest(tc.code)
			for k, v := range jc.ext {
				if k.ok && v.ok {
					seen.appendExt(k.s, v.s)
				}
			}
			err = tc.fresh().Decode(seen)
			switch {
			case tc.missing == "" && err != nil:
				t.Fatalf("a Java 4.9.4+ peer misses a required field: %v", err)
			case tc.missing != "" && (!errors.Is(err, ErrBadHeader) || !bytes.Contains([]byte(err.Error()), []byte(`"`+tc.missing+`"`))):
				t.Fatalf("Java 4.9.4+ should see %q as null; decode error %v", tc.missing, err)
			}
		})
	}
}

// TestBinaryHeaderFromJava decodes headers laid out byte by byte as Java
// 5.3.3 writes them (J1): a SEND_MESSAGE response from the ByteBuf fast
// path (RemotingCommand.fastEncodeHeader: SendMessageResponseHeader.encode's
// writeIfNotNull fields, then the extFields map SendMessageProcessor added
// MSG_REGION and TRACE_ON to), and a response with a null map. A
// zero-length value is kept as a present "" (what Java's JSON encoding
// would deliver); a null field Java skipped is absent.
func TestBinaryHeaderFromJava(t *testing.T) {
	var h []byte
	h = binary.BigEndian.AppendUint16(h, 0) // code SUCCESS
	h = append(h, byte(LanguageJava))
	h = binary.BigEndian.AppendUint16(h, uint16(CurrentVersion))
	h = binary.BigEndian.AppendUint32(h, 9)                    // opaque
	h = binary.BigEndian.AppendUint32(h, uint32(FlagResponse)) // flag
	h = binary.BigEndian.AppendUint32(h, 0)                    // remark null or empty
	var ext []byte
	entry := func(k, v string) {
		ext = binary.BigEndian.AppendUint16(ext, uint16(len(k)))
		ext = append(ext, k...)
		ext = binary.BigEndian.AppendUint32(ext, uint32(len(v)))
		ext = append(ext, v...)
	}
	entry("msgId", "AC11000200002A9F0000000000000001")
	entry("queueId", "3")
	entry("queueOffset", "42")
	entry("transactionId", "") // an empty, non-null value: length 0
	// batchUniqId and recallHandle null: skipped by writeIfNotNull.
	entry("MSG_REGION", "DefaultRegion")
	entry("TRACE_ON", "true")
	h = binary.BigEndian.AppendUint32(h, uint32(len(ext)))
	h = append(h, ext...)
	frame := binary.BigEndian.AppendUint32(nil, uint32(SerializeRocketMQ)<<24|uint32(len(h)))
	frame = append(frame, h...)

	c, err := DecodeFrame(bytes.Clone(frame))
	if err != nil {
		t.Fatal(err)
	}
	if c.Code != 0 || c.Language != LanguageJava || c.Version != CurrentVersion || c.Opaque != 9 || !c.IsResponse() || c.Remark != "" || c.NumExt() != 6 {
		t.Fatalf("decoded %s", dumpCommand(c))
	}
	if v, ok := c.Ext("transactionId"); !ok || v != "" {
		t.Fatalf("transactionId = %q, %v; want present and empty", v, ok)
	}
	if _, ok := c.Ext("batchUniqId"); ok {
		t.Fatal("batchUniqId present")
	}
	var rh SendMessageResponseHeader
	if err := rh.Decode(c); err != nil {
		t.Fatal(err)
	}
	if rh.MsgID != "AC11000200002A9F0000000000000001" || rh.QueueID != 3 || rh.QueueOffset != 42 ||
		rh.TransactionID != "" || rh.MsgRegion != "DefaultRegion" || !rh.TraceOn.V || !rh.TraceOn.Set {
		t.Fatalf("decoded header %+v", rh)
	}
	// Re-encoded, the bytes are Java's again: the entry of length 0 included.
	again, err := c.AppendFrame(nil, SerializeRocketMQ)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again[4:], frame) {
		t.Fatalf("re-encoded\n got %x\nwant %x", again[4:], frame)
	}

	// A response whose map is null (or empty): extFields length 0, and the
	// required fields are missing, as they are null for Java (J4).
	empty := bytes.Clone(frame[:4+17])
	binary.BigEndian.PutUint32(empty, uint32(SerializeRocketMQ)<<24|21)
	empty = binary.BigEndian.AppendUint32(empty, 0)
	c, err = DecodeFrame(empty)
	if err != nil {
		t.Fatal(err)
	}
	if c.NumExt() != 0 || c.Remark != "" {
		t.Fatalf("decoded %s", dumpCommand(c))
	}
	if err := rh.Decode(c); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("decode of a null map: %v, want ErrBadHeader", err)
	}
}
