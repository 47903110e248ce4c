package protocol

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readHexFile reads a golden frame: hex digits, whitespace ignored, '#' starts
// a comment running to the end of the line.
func readHexFile(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "frames", name))
	if err != nil {
		t.Fatal(err)
	}
	var digits strings.Builder
	for line := range strings.SplitSeq(string(raw), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(digits.String())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

// decodeWhole decodes a complete frame including its total-length word,
// checking that word, from a copy of frame.
func decodeWhole(t *testing.T, frame []byte) *Command {
	t.Helper()
	c, err := ReadFrame(bytes.NewReader(bytes.Clone(frame)), 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func routeRequest() *Command {
	c := NewRequest(105)
	c.Language = LanguageGo
	c.Version = 317
	c.Opaque = 7
	c.SetExt("topic", "T")
	return c
}

// javaRouteRequest is the GET_ROUTEINFO_BY_TOPIC request the Java 5.3.3
// client sent in route_request_json.hex and route_request_rocketmq.hex.
func javaRouteRequest() *Command {
	c := NewRequest(105)
	c.Language = LanguageJava
	c.Version = 479
	c.Opaque = 0
	c.SetExt("topic", "runnel_frames_5_3_3")
	return c
}

// TestGoldenRouteRequest decodes the GET_ROUTEINFO_BY_TOPIC requests the
// official Java 5.3.3 client sent through a recording proxy (testdata/frames
// README), in both header encodings. runnel's binary encoding of the same
// command is byte for byte Java's; its JSON encoding differs only in member
// order and in leaving out serializeTypeCurrentRPC (fastjson writes members
// sorted), which no decoder depends on: Java's JSON header is read into the
// same command and runnel's is read back unchanged.
func TestGoldenRouteRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   SerializeType
	}{
		{"route_request_json.hex", SerializeJSON},
		{"route_request_rocketmq.hex", SerializeRocketMQ},
	} {
		t.Run(tc.name, func(t *testing.T) {
			golden := readHexFile(t, tc.name)
			c := decodeWhole(t, golden)
			if !commandsEqual(c, javaRouteRequest()) || c.SerializeType() != tc.st {
				t.Fatalf("decoded %s (serialize type %d), want %s", dumpCommand(c), c.SerializeType(), dumpCommand(javaRouteRequest()))
			}
			frame, err := javaRouteRequest().AppendFrame(nil, tc.st)
			if err != nil {
				t.Fatal(err)
			}
			if tc.st == SerializeRocketMQ && !bytes.Equal(frame, golden) {
				t.Fatalf("runnel's binary encoding differs from Java's\n got %x\nwant %x", frame, golden)
			}
			if back := decodeWhole(t, frame); !commandsEqual(back, c) {
				t.Fatalf("runnel's encoding decodes to %s, want %s", dumpCommand(back), dumpCommand(c))
			}
		})
	}
}

// TestGoldenRouteRequestLiteral pins runnel's own encodings of a
// GET_ROUTEINFO_BY_TOPIC request (protocol reference §1.2): the JSON text,
// with rocketmq-client-go's member order, and the binary bytes.
func TestGoldenRouteRequestLiteral(t *testing.T) {
	frame, err := routeRequest().AppendFrame(nil, SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"code":105,"language":"GO","version":317,"opaque":7,"flag":0,"remark":"","extFields":{"topic":"T"}}`
	if got := string(frame[8:]); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if h := hex.EncodeToString(frame[:8]); h != "0000006800000064" {
		t.Fatalf("length words %s", h)
	}
	bin, err := routeRequest().AppendFrame(nil, SerializeRocketMQ)
	if err != nil {
		t.Fatal(err)
	}
	const wantBin = "00000025010000210069090" + "13d00000007000000000000000000000" + "00c0005746f7069630000000154"
	if got := hex.EncodeToString(bin); got != wantBin {
		t.Fatalf("got  %s\nwant %s", got, wantBin)
	}
}
