//go:build runnelshim

package interop

import (
	"bytes"
	"maps"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/runnelshim"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// This file is built only by scripts/bench.sh, against a copy of the
// official module that has the shim package of testdata/officialshim.

// useEncoding switches the official encoder to st for the rest of b or t.
func useEncoding(tb testing.TB, st protocol.SerializeType) {
	if st == protocol.SerializeRocketMQ {
		tb.Cleanup(runnelshim.UseRocketMQHeaders())
	}
}

func officialHeaderEncode(b *testing.B, st protocol.SerializeType) {
	useEncoding(b, st)
	c := runnelshim.NewRequest(int16(protocol.ReqSendMessage), sendExtMap(), make([]byte, sendBodyLen))
	var buf bytes.Buffer
	if err := c.WriteTo(&buf); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(buf.Len()))
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := c.WriteTo(&buf); err != nil {
			b.Fatal(err)
		}
	}
}

func officialHeaderDecode(b *testing.B, frame []byte) {
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := runnelshim.Decode(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// TestShimCodecsAgree cross-checks the official frame codec directly, in
// both header encodings: frames the official encoder writes decode with
// runnel to the same fields (and, for JSON, re-encode to the same bytes),
// and frames runnel writes decode with the official decoder. The ROCKETMQ
// direction from the official side is otherwise never exercised: the
// official client always sends JSON.
func TestShimCodecsAgree(t *testing.T) {
	for _, enc := range encodings {
		t.Run(enc.name, func(t *testing.T) {
			useEncoding(t, enc.st)
			ext := sendExtMap()
			body := []byte("body\x00\x01")
			oc := runnelshim.NewRequest(int16(protocol.ReqSendMessage), ext, body)
			var buf bytes.Buffer
			if err := oc.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			raw := buf.Bytes()
			if raw[4] != byte(enc.st) {
				t.Fatalf("official frame has serialize type %d", raw[4])
			}
			c, err := protocol.DecodeFrame(bytes.Clone(raw[4:]))
			if err != nil {
				t.Fatalf("runnel cannot decode the official %s frame: %v", enc.name, err)
			}
			if c.Code != protocol.ReqSendMessage || c.Language != protocol.LanguageGo || c.Version != officialVersion ||
				c.Opaque != oc.Opaque() || c.Flag != 0 || c.Remark != "" || !bytes.Equal(c.Body, body) ||
				!maps.Equal(extMap(t, c), ext) {
				t.Errorf("runnel decoded %+v ext %q", c, extMap(t, c))
			}
			again, err := c.AppendFrame(nil, enc.st)
			if err != nil {
				t.Fatal(err)
			}
			if enc.st == protocol.SerializeJSON && !bytes.Equal(again, raw) {
				t.Errorf("runnel re-encoding differs\nofficial %q\nrunnel   %q", raw, again)
			}
			if len(again) != len(raw) {
				t.Errorf("runnel frame %d bytes, official %d", len(again), len(raw))
			}

			// runnel → official, a response with a remark.
			r := protocol.NewResponse(c, protocol.ResTopicNotExist, "no route: é <&>")
			r.Language, r.Version = protocol.LanguageJava, protocol.CurrentVersion
			r.SetExt("queueId", "3")
			r.SetExt("msgId", "0A00000500002A9F000000000000002A")
			r.Body = []byte("x")
			out, err := r.AppendFrame(nil, enc.st)
			if err != nil {
				t.Fatal(err)
			}
			od, err := runnelshim.Decode(out[4:])
			if err != nil {
				t.Fatalf("official decoder rejects runnel's %s frame: %v", enc.name, err)
			}
			if od.Code() != int16(protocol.ResTopicNotExist) || od.Opaque() != c.Opaque || od.Flag() != protocol.FlagResponse ||
				od.Version() != int16(protocol.CurrentVersion) || od.Remark() != r.Remark || string(od.Body()) != "x" ||
				!maps.Equal(od.Ext(), map[string]string{"queueId": "3", "msgId": "0A00000500002A9F000000000000002A"}) {
				t.Errorf("official decoded code %d opaque %d flag %d version %d remark %q ext %q body %q",
					od.Code(), od.Opaque(), od.Flag(), od.Version(), od.Remark(), od.Ext(), od.Body())
			}
		})
	}
}
