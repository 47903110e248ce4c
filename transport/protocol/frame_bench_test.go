package protocol

import (
	"testing"
)

// benchSendRequest is a typical SEND_MESSAGE request as rocketmq-client-go
// sends it: 14 extFields, a properties string with separators, 256-byte body.
func benchSendRequest() *Command {
	c := NewRequest(10)
	c.Language = LanguageGo
	c.Version = CurrentVersion
	c.Opaque = 123456
	c.SetExt("producerGroup", "please_rename_unique_group_name")
	c.SetExt("topic", "TopicTest")
	c.SetExt("defaultTopic", "TBW102")
	c.SetExt("defaultTopicQueueNums", "4")
	c.SetExt("queueId", "3")
	c.SetExt("sysFlag", "0")
	c.SetExt("bornTimestamp", "1700000000123")
	c.SetExt("flag", "0")
	c.SetExt("properties", "KEYS\x01order-42\x02TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000100002A9F00000000000000FF\x02WAIT\x01true\x02")
	c.SetExt("reconsumeTimes", "0")
	c.SetExt("unitMode", "false")
	c.SetExt("maxReconsumeTimes", "0")
	c.SetExt("batch", "false")
	c.SetExt("bname", "broker-a")
	c.Body = make([]byte, 256)
	return c
}

// benchPullRequest is a typical PULL_MESSAGE request.
func benchPullRequest() *Command {
	c := NewRequest(11)
	c.Language = LanguageGo
	c.Version = CurrentVersion
	c.Opaque = 654321
	c.SetExt("consumerGroup", "please_rename_unique_group_name")
	c.SetExt("topic", "TopicTest")
	c.SetExt("queueId", "3")
	c.SetExt("queueOffset", "1234567")
	c.SetExt("maxMsgNums", "32")
	c.SetExt("sysFlag", "3")
	c.SetExt("commitOffset", "1234500")
	c.SetExt("suspendTimeoutMillis", "20000")
	c.SetExt("subscription", "TagA || TagB")
	c.SetExt("subVersion", "1700000000123456789")
	c.SetExt("expressionType", "TAG")
	c.SetExt("bname", "broker-a")
	return c
}

var benchCases = []struct {
	name string
	cmd  func() *Command
}{
	{"SendMessage", benchSendRequest},
	{"PullMessage", benchPullRequest},
}

var benchEncodings = []struct {
	name string
	st   SerializeType
}{
	{"JSON", SerializeJSON},
	{"RocketMQ", SerializeRocketMQ},
}

// BenchmarkHeaderEncode measures AppendFrame into a reused buffer.
func BenchmarkHeaderEncode(b *testing.B) {
	for _, enc := range benchEncodings {
		for _, bc := range benchCases {
			b.Run(enc.name+"/"+bc.name, func(b *testing.B) {
				c := bc.cmd()
				buf, err := c.AppendFrame(nil, enc.st)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(buf)))
				b.ReportAllocs()
				for b.Loop() {
					buf, err = c.AppendFrame(buf[:0], enc.st)
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkHeaderDecode measures DecodeFrame of one frame. The frame is
// copied into the decode buffer on every iteration because JSON decoding
// unescapes in place; the copy is part of the figure.
func BenchmarkHeaderDecode(b *testing.B) {
	for _, enc := range benchEncodings {
		for _, bc := range benchCases {
			b.Run(enc.name+"/"+bc.name, func(b *testing.B) {
				frame, err := bc.cmd().AppendFrame(nil, enc.st)
				if err != nil {
					b.Fatal(err)
				}
				frame = frame[4:]
				buf := make([]byte, len(frame))
				b.SetBytes(int64(len(frame)))
				b.ReportAllocs()
				for b.Loop() {
					copy(buf, frame)
					if _, err := DecodeFrame(buf); err != nil {
						b.Fatal(err)
					}
				}
			})
			// The same into a reused Command (DecodeFrameInto): the cost of
			// parsing the header alone, without the *Command allocation and
			// the GC work it causes.
			b.Run(enc.name+"/"+bc.name+"/ParseOnly", func(b *testing.B) {
				frame, err := bc.cmd().AppendFrame(nil, enc.st)
				if err != nil {
					b.Fatal(err)
				}
				frame = frame[4:]
				buf := make([]byte, len(frame))
				c := new(Command)
				b.SetBytes(int64(len(frame)))
				b.ReportAllocs()
				for b.Loop() {
					copy(buf, frame)
					if err := DecodeFrameInto(c, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
