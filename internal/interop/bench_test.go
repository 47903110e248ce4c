package interop

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Benchmarks come in pairs, Benchmark<What>/<case>/impl=runnel and
// /impl=official, for `benchstat -col /impl`. Both sides get the same input
// and do what each library does on its hot path; differences in what the
// two APIs return are noted on each benchmark.

// sendExt is a typical SEND_MESSAGE request header as the official producer
// writes it (the same fields as runnel's protocol benchmark).
var sendExt = [][2]string{
	{"producerGroup", "please_rename_unique_group_name"},
	{"topic", "TopicTest"},
	{"defaultTopic", "TBW102"},
	{"defaultTopicQueueNums", "4"},
	{"queueId", "3"},
	{"sysFlag", "0"},
	{"bornTimestamp", "1700000000123"},
	{"flag", "0"},
	{"properties", "KEYS\x01order-42\x02TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000100002A9F00000000000000FF\x02WAIT\x01true\x02"},
	{"reconsumeTimes", "0"},
	{"unitMode", "false"},
	{"maxReconsumeTimes", "0"},
	{"batch", "false"},
	{"bname", "broker-a"},
}

const sendBodyLen = 256

func runnelSendCommand() *protocol.Command {
	c := protocol.NewRequest(protocol.ReqSendMessage)
	c.Language, c.Version, c.Opaque = protocol.LanguageGo, officialVersion, 123456
	for _, kv := range sendExt {
		c.SetExt(kv[0], kv[1])
	}
	c.Body = make([]byte, sendBodyLen)
	return c
}

func sendExtMap() map[string]string {
	m := make(map[string]string, len(sendExt))
	for _, kv := range sendExt {
		m[kv[0]] = kv[1]
	}
	return m
}

// BenchmarkHeaderEncode encodes a whole SEND_MESSAGE request frame (header
// and 256-byte body). runnel: Command.AppendFrame into a reused buffer.
// official: RemotingCommand.WriteTo into a reused bytes.Buffer, which is what
// the client runs for every request (onto the TCP connection).
func BenchmarkHeaderEncode(b *testing.B) {
	for _, enc := range encodings {
		b.Run(enc.name+"/SendMessage/impl=runnel", func(b *testing.B) {
			c := runnelSendCommand()
			buf, err := c.AppendFrame(nil, enc.st)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = c.AppendFrame(buf[:0], enc.st); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(enc.name+"/SendMessage/impl=official", func(b *testing.B) {
			officialHeaderEncode(b, enc.st)
		})
	}
}

// BenchmarkHeaderDecode decodes the same SEND_MESSAGE frame (without its
// length word). runnel: DecodeFrame, which aliases and unescapes in place,
// so the frame is copied into the decode buffer each time and the copy is
// counted. official: the client's decode, which copies header and body into
// new slices and builds an extFields map.
func BenchmarkHeaderDecode(b *testing.B) {
	for _, enc := range encodings {
		frame, err := runnelSendCommand().AppendFrame(nil, enc.st)
		if err != nil {
			b.Fatal(err)
		}
		frame = frame[4:]
		b.Run(enc.name+"/SendMessage/impl=runnel", func(b *testing.B) {
			buf := make([]byte, len(frame))
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				copy(buf, frame)
				if _, err := protocol.DecodeFrame(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(enc.name+"/SendMessage/impl=official", func(b *testing.B) {
			officialHeaderDecode(b, frame)
		})
	}
}

var bodySizes = []struct {
	name string
	n    int
}{
	{"body=128B", 128},
	{"body=1KiB", 1024},
}

// benchRecord is a typical pulled record: IPv4 hosts, TAGS, KEYS, UNIQ_KEY
// and CLUSTER properties.
func benchRecord(n int) protocol.MessageExt {
	return protocol.MessageExt{
		QueueID: 3, QueueOffset: 123456, CommitLogOffset: 987654321,
		BornTimestamp: 1700000000000, BornHost: netip.MustParseAddrPort("10.0.0.9:54321"),
		StoreTimestamp: 1700000000100, StoreHost: netip.MustParseAddrPort("10.0.0.5:10911"),
		Body: bytes.Repeat([]byte{'x'}, n), Topic: "TopicTest",
		Properties: props("TAGS", "TagA", "KEYS", "order-42", "UNIQ_KEY", "0A0000090001000000000000DEAD0001",
			"CLUSTER", "DefaultCluster"),
	}
}

// BenchmarkRecordDecode decodes one stored record, as a consumer does for
// every pulled message. runnel: DecodeRecord, which aliases the buffer (no
// copy of body, topic or properties; properties stay a raw string read with
// PropertyValue). official: primitive.DecodeMessage, which returns a
// *MessageExt with copied strings, formatted host strings, message ids and
// a parsed properties map. The figures compare the two decoders as
// designed, not equal amounts of work.
func BenchmarkRecordDecode(b *testing.B) {
	for _, sz := range bodySizes {
		m := benchRecord(sz.n)
		rec, err := m.AppendRecord(nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(sz.name+"/impl=runnel", func(b *testing.B) {
			b.SetBytes(int64(len(rec)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := protocol.DecodeRecord(rec); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sz.name+"/impl=official", func(b *testing.B) {
			b.SetBytes(int64(len(rec)))
			b.ReportAllocs()
			for b.Loop() {
				if len(primitive.DecodeMessage(rec)) != 1 {
					b.Fatal("official decoder lost the record")
				}
			}
		})
	}
}

// BenchmarkRecordEncode encodes one stored record with runnel's
// AppendRecord into a reused buffer (what runnel's broker does per stored
// message). The official client has no record encoder (only brokers write
// records), so there is no official row.
func BenchmarkRecordEncode(b *testing.B) {
	for _, sz := range bodySizes {
		b.Run(sz.name, func(b *testing.B) {
			m := benchRecord(sz.n)
			buf, err := m.AppendRecord(nil)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = m.AppendRecord(buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchProps are the properties of a typical produced message.
var benchProps = map[string]string{
	"TAGS": "TagA", "KEYS": "order-42 customer-7", "UNIQ_KEY": "C0A8000100002A9F00000000000000FF",
	"WAIT": "true", "DELAY": "3", "TRACE_ON": "true",
}

// BenchmarkBatchItemEncode encodes one SEND_BATCH_MESSAGE item of a message
// with the benchProps properties. runnel: AppendBatchItem into a reused
// buffer, with the properties already a raw string (runnel's message model).
// official: Message.Marshal, which serialises the properties map and
// allocates the item (its message model keeps properties in a map).
func BenchmarkBatchItemEncode(b *testing.B) {
	for _, sz := range bodySizes {
		body := bytes.Repeat([]byte{'x'}, sz.n)
		raw := string(protocol.AppendProperties(nil, benchProps))
		b.Run(sz.name+"/impl=runnel", func(b *testing.B) {
			buf, err := protocol.AppendBatchItem(nil, 0, body, raw)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = protocol.AppendBatchItem(buf[:0], 0, body, raw); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sz.name+"/impl=official", func(b *testing.B) {
			m := primitive.NewMessage("TopicTest", body)
			m.WithProperties(maps.Clone(benchProps))
			b.SetBytes(int64(len(m.Marshal())))
			b.ReportAllocs()
			for b.Loop() {
				_ = m.Marshal()
			}
		})
	}
}

// BenchmarkPropertiesMarshal turns a properties map into the wire string.
// runnel: AppendProperties into a reused buffer (sorted, deterministic).
// official: Message.MarshallProperties (map order, returns a new string).
func BenchmarkPropertiesMarshal(b *testing.B) {
	name := fmt.Sprintf("props=%d", len(benchProps))
	b.Run(name+"/impl=runnel", func(b *testing.B) {
		buf := protocol.AppendProperties(nil, benchProps)
		b.ReportAllocs()
		for b.Loop() {
			buf = protocol.AppendProperties(buf[:0], benchProps)
		}
	})
	b.Run(name+"/impl=official", func(b *testing.B) {
		m := primitive.NewMessage("TopicTest", nil)
		m.WithProperties(maps.Clone(benchProps))
		b.ReportAllocs()
		for b.Loop() {
			_ = m.MarshallProperties()
		}
	})
}

// BenchmarkPropertiesUnmarshal parses the wire string into a map, as both
// clients do when a program asks for all properties. runnel:
// ParseProperties. official: Message.UnmarshalProperties into a fresh
// message. (runnel's hot path needs no map: see
// BenchmarkPropertyLookup.)
func BenchmarkPropertiesUnmarshal(b *testing.B) {
	raw := string(protocol.AppendProperties(nil, benchProps))
	name := fmt.Sprintf("props=%d", len(benchProps))
	b.Run(name+"/impl=runnel", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(protocol.ParseProperties(raw)) != len(benchProps) {
				b.Fatal("lost properties")
			}
		}
	})
	b.Run(name+"/impl=official", func(b *testing.B) {
		data := []byte(raw)
		b.ReportAllocs()
		for b.Loop() {
			var m primitive.Message
			m.UnmarshalProperties(data)
		}
	})
}

// BenchmarkPropertyLookup is runnel's way to read one property of a record
// (PropertyValue on the raw string, no map); it has no official
// counterpart, whose messages always carry a parsed map.
func BenchmarkPropertyLookup(b *testing.B) {
	raw := string(protocol.AppendProperties(nil, benchProps))
	b.ReportAllocs()
	for b.Loop() {
		if v, ok := protocol.PropertyValue(raw, "UNIQ_KEY"); !ok || len(v) != 32 {
			b.Fatal("lost UNIQ_KEY")
		}
	}
}
