package protocol

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden frames in testdata/frames that the encoder produces")

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

// writeHexFile writes frame as a golden file: comment lines, then 32 bytes of
// hex per line.
func writeHexFile(t testing.TB, name, comment string, frame []byte) {
	t.Helper()
	var sb strings.Builder
	for line := range strings.SplitSeq(strings.TrimRight(comment, "\n"), "\n") {
		sb.WriteString("# " + line + "\n")
	}
	for i := 0; i < len(frame); i += 32 {
		end := min(i+32, len(frame))
		for j := i; j < end; j += 4 {
			if j > i {
				sb.WriteByte(' ')
			}
			sb.WriteString(hex.EncodeToString(frame[j:min(j+4, end)]))
		}
		sb.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join("testdata", "frames", name), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkGoldenEncode compares frame with the golden file name, or rewrites the
// file under -rewrite.
func checkGoldenEncode(t *testing.T, name, comment string, frame []byte) {
	t.Helper()
	if *rewrite {
		writeHexFile(t, name, comment, frame)
		return
	}
	want := readHexFile(t, name)
	if !bytes.Equal(frame, want) {
		t.Fatalf("%s: encoder output differs from golden bytes\n got %x\nwant %x", name, frame, want)
	}
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

// TestGoldenRouteRequest checks the two GET_ROUTEINFO_BY_TOPIC frames captured
// from rocketmq-client-go (protocol reference §1.2) byte for byte, both ways.
func TestGoldenRouteRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   SerializeType
		size int
	}{
		{"route_request_json.hex", SerializeJSON, 104},
		{"route_request_rocketmq.hex", SerializeRocketMQ, 37},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frame, err := routeRequest().AppendFrame(nil, tc.st)
			if err != nil {
				t.Fatal(err)
			}
			if len(frame) != 4+tc.size {
				t.Fatalf("frame is %d bytes, want 4+%d", len(frame), tc.size)
			}
			checkGoldenEncode(t, tc.name, "GET_ROUTEINFO_BY_TOPIC (105), topic T, opaque 7, as sent by rocketmq-client-go", frame)
			c := decodeWhole(t, readHexFile(t, tc.name))
			if !commandsEqual(c, routeRequest()) {
				t.Fatalf("decoded %s, want %s", dumpCommand(c), dumpCommand(routeRequest()))
			}
		})
	}
}

// TestGoldenRouteRequestLiteral pins the JSON text of §1.2 independently of
// the golden file.
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
