package protocol

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var msgHexComment = regexp.MustCompile(`#.*`)

// msgReadHex reads a testdata file of hex bytes with '#' comments.
func msgReadHex(t testing.TB, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := msgHexComment.ReplaceAllString(string(raw), "")
	s = strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

// a1Message is the message of Appendix A.1.
func a1Message() MessageExt {
	var p []byte
	p = AppendProperty(p, PropTags, "TagA")
	p = AppendProperty(p, PropUniqKey, "0A0000090001000000000000DEAD0001")
	p = AppendProperty(p, PropCluster, "DefaultCluster")
	return MessageExt{
		QueueID:         1,
		QueueOffset:     5,
		CommitLogOffset: 0x1234,
		BornTimestamp:   1700000000000,
		BornHost:        netip.MustParseAddrPort("10.0.0.9:54321"),
		StoreTimestamp:  1700000000100,
		StoreHost:       netip.MustParseAddrPort("10.0.0.5:10911"),
		Body:            []byte("hello"),
		Topic:           "TopicTest",
		Properties:      string(p),
	}
}

func TestRecordGoldenA1(t *testing.T) {
	golden := msgReadHex(t, "testdata/messages/record_a1.hex")
	if len(golden) != 180 {
		t.Fatalf("golden is %d bytes, want 180", len(golden))
	}
	m := a1Message()
	got, err := m.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, golden) {
		t.Fatalf("encode mismatch:\n got %x\nwant %x", got, golden)
	}

	d, n, err := DecodeRecord(golden)
	if err != nil {
		t.Fatal(err)
	}
	if n != 180 || d.StoreSize != 180 || d.BodyCRC != 0x3610a686 {
		t.Fatalf("n=%d storeSize=%d crc=%x", n, d.StoreSize, d.BodyCRC)
	}
	want := m
	want.StoreSize, want.BodyCRC = 180, 0x3610a686
	if !equalMsg(d, want) {
		t.Fatalf("decode mismatch:\n got %+v\nwant %+v", d, want)
	}
	if d.Tags() != "TagA" || d.UniqKey() != "0A0000090001000000000000DEAD0001" || d.Keys() != "" {
		t.Fatalf("helpers: tags %q uniq %q keys %q", d.Tags(), d.UniqKey(), d.Keys())
	}
	if got := d.MsgID(); got != "0A0000090001000000000000DEAD0001" {
		t.Fatalf("MsgID %q", got)
	}
	if got := d.OffsetMsgID(); got != "0A00000500002A9F0000000000001234" {
		t.Fatalf("OffsetMsgID %q", got)
	}

	// Two concatenated records, as a PULL body.
	two := append(append([]byte{}, golden...), golden...)
	var count int
	err = DecodeRecords(two, func(m *MessageExt) bool {
		count++
		if !equalMsg(*m, want) {
			t.Errorf("record %d mismatch: %+v", count, *m)
		}
		return true
	})
	if err != nil || count != 2 {
		t.Fatalf("DecodeRecords: count %d err %v", count, err)
	}
	// Early stop.
	count = 0
	if err := DecodeRecords(two, func(*MessageExt) bool { count++; return false }); err != nil || count != 1 {
		t.Fatalf("early stop: count %d err %v", count, err)
	}
}

func equalMsg(a, b MessageExt) bool {
	if len(a.Body) == 0 && len(b.Body) == 0 {
		a.Body, b.Body = nil, nil
	}
	return a.StoreSize == b.StoreSize && a.BodyCRC == b.BodyCRC && a.QueueID == b.QueueID &&
		a.Flag == b.Flag && a.QueueOffset == b.QueueOffset && a.CommitLogOffset == b.CommitLogOffset &&
		a.SysFlag == b.SysFlag && a.BornTimestamp == b.BornTimestamp && a.BornHost == b.BornHost &&
		a.StoreTimestamp == b.StoreTimestamp && a.StoreHost == b.StoreHost &&
		a.ReconsumeTimes == b.ReconsumeTimes && a.PreparedTransactionOffset == b.PreparedTransactionOffset &&
		bytes.Equal(a.Body, b.Body) && a.Topic == b.Topic && a.Properties == b.Properties
}

func TestRecordPositions(t *testing.T) {
	m := a1Message()
	b, err := m.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	be := func(p, n int) uint64 {
		var v uint64
		for _, c := range b[p : p+n] {
			v = v<<8 | uint64(c)
		}
		return v
	}
	if be(RecordQueueOffsetPos, 8) != 5 || be(RecordPhysicalOffsetPos, 8) != 0x1234 ||
		be(RecordSysFlagPos, 4) != 0 || be(RecordBornTimestampPos, 8) != 1700000000000 ||
		be(RecordQueueIDPos, 4) != 1 || be(RecordStoreTimestampPos(0), 8) != 1700000000100 ||
		be(RecordStoreHostPos(0), 4) != 0x0a000005 {
		t.Fatal("position constants do not match the encoding")
	}
	if RecordStoreTimestampPos(0) != 56 || RecordStoreTimestampPos(SysFlagBornHostV6) != 68 {
		t.Fatal("store timestamp positions")
	}
}

func TestRecordRoundTripVariants(t *testing.T) {
	v6a := netip.MustParseAddrPort("[2001:db8::1]:10911")
	v6b := netip.MustParseAddrPort("[fe80::2]:65535")
	cases := []struct {
		name      string
		topicLen  int
		born      netip.AddrPort
		store     netip.AddrPort
		wantMagic uint32
		wantSize  int
	}{
		{"v4-127", 127, netip.MustParseAddrPort("1.2.3.4:1"), netip.MustParseAddrPort("5.6.7.8:2"), MessageMagicV1, 91 + 127},
		{"v4-128", 128, netip.MustParseAddrPort("1.2.3.4:1"), netip.MustParseAddrPort("5.6.7.8:2"), MessageMagicV2, 92 + 128},
		{"born6", 10, v6a, netip.MustParseAddrPort("5.6.7.8:2"), MessageMagicV1, 91 + 12 + 10},
		{"store6", 10, netip.MustParseAddrPort("1.2.3.4:1"), v6b, MessageMagicV1, 91 + 12 + 10},
		{"both6-v2", 300, v6a, v6b, MessageMagicV2, 92 + 24 + 300},
		{"max-topic", MaxTopicLength, v6a, v6b, MessageMagicV2, 92 + 24 + MaxTopicLength},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := MessageExt{
				QueueID: 3, Flag: -7, QueueOffset: 1 << 40, CommitLogOffset: -1,
				SysFlag:       SysFlagCompressed | SysFlagTransactionCommit | SysFlagBornHostV6, // v6 bit recomputed
				BornTimestamp: 1, BornHost: c.born, StoreTimestamp: 2, StoreHost: c.store,
				ReconsumeTimes: 16, PreparedTransactionOffset: 99,
				Topic: strings.Repeat("t", c.topicLen),
			}
			b, err := m.AppendRecord([]byte("prefix"))
			if err != nil {
				t.Fatal(err)
			}
			b = b[len("prefix"):]
			if len(b) != c.wantSize {
				t.Fatalf("size %d want %d", len(b), c.wantSize)
			}
			d, n, err := DecodeRecord(b)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(b) {
				t.Fatalf("n %d", n)
			}
			if uint32(b[4])<<24|uint32(b[5])<<16|uint32(b[6])<<8|uint32(b[7]) != c.wantMagic {
				t.Fatalf("magic %x", b[4:8])
			}
			want := m
			want.SysFlag = SysFlagCompressed | SysFlagTransactionCommit
			if c.born.Addr().Is6() {
				want.SysFlag |= SysFlagBornHostV6
			}
			if c.store.Addr().Is6() {
				want.SysFlag |= SysFlagStoreHostV6
			}
			want.StoreSize, want.BodyCRC = int32(len(b)), BodyCRC(nil)
			if !equalMsg(d, want) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", d, want)
			}
			// Re-encoding the decoded record is byte-identical.
			again, err := d.AppendRecord(nil)
			if err != nil || !bytes.Equal(again, b) {
				t.Fatalf("re-encode differs: %v", err)
			}
		})
	}
}

func TestRecordEncodeLimits(t *testing.T) {
	m := MessageExt{Topic: strings.Repeat("x", MaxTopicLength+1)}
	if _, err := m.AppendRecord(nil); !errors.Is(err, ErrRecordInvalid) {
		t.Fatalf("long topic: %v", err)
	}
	m = MessageExt{Topic: "t", Properties: strings.Repeat("x", MaxPropertiesLength+1)}
	if _, err := m.AppendRecord(nil); !errors.Is(err, ErrRecordInvalid) {
		t.Fatalf("long properties: %v", err)
	}
	// IPv4-mapped addresses are written as IPv4; the zero address as 0.0.0.0.
	m = MessageExt{Topic: "t", BornHost: netip.MustParseAddrPort("[::ffff:1.2.3.4]:5")}
	b, err := m.AppendRecord(nil)
	if err != nil || len(b) != 92 {
		t.Fatalf("mapped: len %d err %v", len(b), err)
	}
	d, _, err := DecodeRecord(b)
	if err != nil || d.BornHost != netip.MustParseAddrPort("1.2.3.4:5") || d.StoreHost != netip.MustParseAddrPort("0.0.0.0:0") {
		t.Fatalf("mapped decode: %+v %v", d, err)
	}
}

func TestRecordDecodeErrors(t *testing.T) {
	golden := msgReadHex(t, "testdata/messages/record_a1.hex")
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte{}, golden...)) }
	cases := map[string][]byte{
		"empty":         nil,
		"short":         golden[:7],
		"truncated":     golden[:179],
		"blank":         mut(func(b []byte) []byte { copy(b[4:], []byte{0xCB, 0xD4, 0x31, 0x94}); return b }),
		"magic":         mut(func(b []byte) []byte { b[7] = 0; return b }),
		"size-small":    mut(func(b []byte) []byte { b[3] = 90; return b }),
		"size-neg":      mut(func(b []byte) []byte { b[0] = 0x80; return b }),
		"size-mismatch": mut(func(b []byte) []byte { b[3] = 179; return b[:179] }),
		"size-large":    mut(func(b []byte) []byte { b[3] = 181; return append(b, 0) }),
		"body-neg":      mut(func(b []byte) []byte { b[84] = 0xFF; return b }),
		"body-long":     mut(func(b []byte) []byte { b[87] = 200; return b }),
		"topic-long":    mut(func(b []byte) []byte { b[93] = 0xFF; return b }),
		"props-neg":     mut(func(b []byte) []byte { b[103] = 0x80; return b }),
		"port":          mut(func(b []byte) []byte { b[52] = 0x01; return b }),
		"v6-flag":       mut(func(b []byte) []byte { b[39] = byte(SysFlagBornHostV6); return b }),
	}
	for name, b := range cases {
		_, _, err := DecodeRecord(b)
		if !errors.Is(err, ErrRecordInvalid) {
			t.Errorf("%s: err %v, want ErrRecordInvalid", name, err)
		}
	}
	if _, _, err := DecodeRecord(cases["blank"]); !errors.Is(err, ErrRecordBlank) {
		t.Errorf("blank: %v", err)
	}
	// An invalid second record stops DecodeRecords with an error after the first.
	var n int
	err := DecodeRecords(append(append([]byte{}, golden...), golden[:100]...), func(*MessageExt) bool { n++; return true })
	if !errors.Is(err, ErrRecordInvalid) || n != 1 {
		t.Fatalf("n=%d err=%v", n, err)
	}
}

func TestRecordAliasingAndClone(t *testing.T) {
	b := msgReadHex(t, "testdata/messages/record_a1.hex")
	d, _, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	c := d.Clone()
	b[88] = 'H'  // body
	b[94] = 'X'  // topic
	b[106] = 'x' // properties: TAGS -> TxGS
	if string(d.Body) != "Hello" || d.Topic[0] != 'X' {
		t.Fatalf("decode should alias the buffer: %q %q", d.Body, d.Topic)
	}
	if string(c.Body) != "hello" || c.Topic != "TopicTest" || c.Tags() != "TagA" {
		t.Fatalf("clone shares memory: %q %q %q", c.Body, c.Topic, c.Tags())
	}
}

func TestRecordCompressedBody(t *testing.T) {
	body := bytes.Repeat([]byte("compressible "), 1000)
	z, err := Compress(nil, body, DefaultCompressLevel)
	if err != nil {
		t.Fatal(err)
	}
	m := MessageExt{Topic: "t", Body: z, SysFlag: SysFlagCompressed}
	b, err := m.AppendRecord(nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if d.BodyCRC != BodyCRC(z) || !d.Compressed() {
		t.Fatal("CRC must be over the stored (compressed) body")
	}
	got, err := d.DecompressedBody(1 << 20)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("decompress: %v", err)
	}
	if _, err := d.DecompressedBody(100); !errors.Is(err, ErrDecompressTooLarge) {
		t.Fatalf("bound: %v", err)
	}
}

func TestProducerMessage(t *testing.T) {
	m := Message{Topic: "t"}
	m.SetProperty(PropTags, "A")
	m.SetProperty(PropKeys, "k1 k2")
	m.SetProperty(PropTags, "B")
	if m.Tags() != "B" || m.Properties != "KEYS\x01k1 k2\x02TAGS\x01B\x02" {
		t.Fatalf("%q", m.Properties)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	golden := msgReadHex(f, "testdata/messages/record_a1.hex")
	f.Add(golden)
	m := a1Message()
	m.BornHost = netip.MustParseAddrPort("[2001:db8::1]:1")
	m.Topic = strings.Repeat("t", 200)
	v2, _ := m.AppendRecord(nil)
	f.Add(v2)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, n, err := DecodeRecord(b)
		if err != nil {
			return
		}
		if n <= 0 || n > len(b) {
			t.Fatalf("n %d of %d", n, len(b))
		}
		// A valid record re-encodes to the same bytes, except for the v6
		// flags of mapped addresses (none can be decoded from IPv4 fields) and
		// a V2 magic on a short topic, which AppendRecord writes as V1, and
		// BODYCRC, which AppendRecord recomputes.
		again, err := d.AppendRecord(nil)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		d2, n2, err := DecodeRecord(again)
		if err != nil || n2 != len(again) {
			t.Fatalf("decode of re-encode: %v", err)
		}
		if d.BornHost.Addr().Is4In6() || d.StoreHost.Addr().Is4In6() {
			return // mapped addresses are re-encoded as IPv4 by design
		}
		d2.StoreSize, d2.BodyCRC = d.StoreSize, d.BodyCRC
		if !equalMsg(d, d2) {
			t.Fatalf("round trip:\n%+v\n%+v", d, d2)
		}
		if b[4] == 0xDA && b[7] == 0xA7 && d.BodyCRC == BodyCRC(d.Body) && !bytes.Equal(again, b[:n]) {
			t.Fatalf("V1 record with valid CRC did not re-encode identically")
		}
	})
}

func FuzzDecodeRecords(f *testing.F) {
	golden := msgReadHex(f, "testdata/messages/record_a1.hex")
	f.Add(append(append([]byte{}, golden...), golden...))
	f.Add(golden[:150])
	f.Fuzz(func(t *testing.T, b []byte) {
		total := 0
		_ = DecodeRecords(b, func(m *MessageExt) bool {
			total += int(m.StoreSize)
			if total > len(b) {
				t.Fatalf("records exceed input")
			}
			return true
		})
	})
}

func benchRecord(bodySize int) MessageExt {
	m := a1Message()
	m.Body = bytes.Repeat([]byte{'x'}, bodySize)
	return m
}

func BenchmarkRecordEncode(b *testing.B) {
	for _, size := range []int{128, 1024} {
		b.Run(msgSizeName(size), func(b *testing.B) {
			m := benchRecord(size)
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				var err error
				if buf, err = m.AppendRecord(buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRecordDecode(b *testing.B) {
	for _, size := range []int{128, 1024} {
		b.Run(msgSizeName(size), func(b *testing.B) {
			m := benchRecord(size)
			buf, _ := m.AppendRecord(nil)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				d, _, err := DecodeRecord(buf)
				if err != nil || len(d.Body) != size {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecodeRecords32(b *testing.B) {
	m := benchRecord(128)
	var buf []byte
	for range 32 {
		buf, _ = m.AppendRecord(buf)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		n := 0
		if err := DecodeRecords(buf, func(*MessageExt) bool { n++; return true }); err != nil || n != 32 {
			b.Fatal(err)
		}
	}
}

func msgSizeName(n int) string {
	if n >= 1024 {
		return strconv.Itoa(n/1024) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
