package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"testing/iotest"
)

// TestGoldenSendMessageGo decodes the SEND_MESSAGE request of protocol
// reference §2.5 as rocketmq-client-go writes it, and checks that re-encoding
// it gives the same bytes (runnel's JSON member order is the Go client's).
func TestGoldenSendMessageGo(t *testing.T) {
	golden := readHexFile(t, "send_message_go_json.hex")
	c := decodeWhole(t, golden)
	if c.Code != 10 || c.Language != LanguageGo || c.Version != 317 || c.Opaque != 1 || c.Flag != 0 || c.Remark != "" {
		t.Fatalf("header fields: %s", dumpCommand(c))
	}
	if string(c.Body) != "Hello" {
		t.Fatalf("body %q", c.Body)
	}
	if c.NumExt() != 14 {
		t.Fatalf("%d extFields, want 14", c.NumExt())
	}
	if p, _ := c.Ext("properties"); p != "TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000100002A9F0000000000000001\x02" {
		t.Fatalf("properties %q", p)
	}
	for k, v := range map[string]string{"producerGroup": "pg", "topic": "TopicTest", "bname": "broker-a", "bornTimestamp": "1700000000000", "defaultTopic": "TBW102"} {
		if got, ok := c.Ext(k); !ok || got != v {
			t.Errorf("ext %s = %q, %v; want %q", k, got, ok, v)
		}
	}
	again, err := c.AppendFrame(nil, SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, golden) {
		t.Fatalf("re-encoded frame differs\n got %s\nwant %s", again[8:], golden[8:])
	}
}

// TestGoldenSendResponseJava decodes the Java 5.3.3 broker's response to a
// SEND_MESSAGE_V2 (captured, testdata/frames README): fastjson's sorted
// members, no remark, serializeTypeCurrentRPC, extFields in HashMap order.
func TestGoldenSendResponseJava(t *testing.T) {
	c := decodeWhole(t, readHexFile(t, "send_response_java_json.hex"))
	if c.Code != 0 || c.Language != LanguageJava || c.Version != 479 || c.Opaque != 2 || !c.IsResponse() || c.Remark != "" || c.Body != nil {
		t.Fatalf("header fields: %s", dumpCommand(c))
	}
	want := []ExtField{{"queueId", "1"}, {"transactionId", "FD00000000000000000000000000000265D54E0E2F2A03671B5D0000"},
		{"msgId", "7F000001000098370000000000000000"}, {"TRACE_ON", "true"}, {"MSG_REGION", "DefaultRegion"}, {"queueOffset", "0"}}
	if c.NumExt() != len(want) {
		t.Fatalf("%d extFields", c.NumExt())
	}
	for i, f := range want {
		if c.ExtAt(i) != f {
			t.Errorf("ext %d = %v, want %v", i, c.ExtAt(i), f)
		}
	}
}

// jsonFrame builds a frame (without total-length word) around a JSON header.
func jsonFrame(header string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(header)))
	return append(b, header...)
}

func TestJSONHeaderTolerance(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		check        func(*Command) bool
	}{
		{"minimal", `{}`, func(c *Command) bool { return c.Code == 0 && c.NumExt() == 0 }},
		{"whitespace", " \t\r\n{ \"code\" : 17 , \"extFields\" : { \"a\" : \"b\" } }\n ",
			func(c *Command) bool { v, _ := c.Ext("a"); return c.Code == 17 && v == "b" }},
		{"any order", `{"extFields":{"k":"v"},"opaque":-5,"code":3,"language":"JAVA","flag":3}`,
			func(c *Command) bool { return c.Opaque == -5 && c.Code == 3 && c.Flag == 3 && c.IsOneway() }},
		{"unknown nested", `{"x":{"a":[1,2,{"b":null}],"c":"d\"}"},"y":[],"z":-1.5e+3,"w":true,"code":1}`,
			func(c *Command) bool { return c.Code == 1 }},
		{"nulls", `{"code":null,"remark":null,"extFields":null,"language":null}`,
			func(c *Command) bool { return c.Code == 0 && c.Remark == "" && c.NumExt() == 0 }},
		{"language number", `{"language":9}`, func(c *Command) bool { return c.Language == LanguageGo }},
		{"language unknown name", `{"language":"COBOL"}`, func(c *Command) bool { return c.Language == LanguageOther }},
		{"ext non-strings", `{"extFields":{"n":12,"f":-1.25e2,"t":true,"F":false,"z":null}}`, func(c *Command) bool {
			n, _ := c.Ext("n")
			f, _ := c.Ext("f")
			tr, _ := c.Ext("t")
			fa, _ := c.Ext("F")
			_, z := c.Ext("z")
			return n == "12" && f == "-1.25e2" && tr == "true" && fa == "false" && !z && c.NumExt() == 4
		}},
		{"escapes", `{"remark":"a\"b\\c\/d\b\f\n\r\t\u0001\u00e9\u20AC\ud83d\ude00\ud800x"}`,
			func(c *Command) bool { return c.Remark == "a\"b\\c/d\b\f\n\r\t\x01é€😀\uFFFDx" }},
		{"escaped key", `{"co\u0064e":42}`, func(c *Command) bool { return c.Code == 42 }},
		{"duplicate ext key last wins", `{"extFields":{"k":"1","k":"2"}}`,
			func(c *Command) bool { v, _ := c.Ext("k"); return v == "2" && c.NumExt() == 2 }},
		{"repeated extFields replaces", `{"extFields":{"a":"1"},"extFields":{"b":"2"}}`,
			func(c *Command) bool { _, a := c.Ext("a"); return !a && c.NumExt() == 1 }},
		{"int32 bounds", `{"code":-2147483648,"opaque":2147483647}`,
			func(c *Command) bool { return c.Code == math.MinInt32 && c.Opaque == math.MaxInt32 }},
		{"pop code", `{"code":200050}`, func(c *Command) bool { return c.Code == 200050 }},
		{"raw utf8", "{\"remark\":\"h\u00e9llo\xff\"}", func(c *Command) bool { return c.Remark == "h\u00e9llo\xff" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DecodeFrame(jsonFrame(tc.header))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("unexpected result %s", dumpCommand(c))
			}
		})
	}
}

func TestDecodeMalformed(t *testing.T) {
	deep := strings.Repeat(`{"a":`, maxJSONDepth+1) + "1" + strings.Repeat("}", maxJSONDepth+1)
	okDeep := strings.Repeat(`{"a":`, maxJSONDepth) + "1" + strings.Repeat("}", maxJSONDepth)
	if _, err := DecodeFrame(jsonFrame(okDeep)); err != nil {
		t.Fatalf("nesting of %d levels rejected: %v", maxJSONDepth, err)
	}
	var manyExt strings.Builder
	manyExt.WriteString(`{"extFields":{`)
	for i := range MaxExtFields + 1 {
		if i > 0 {
			manyExt.WriteByte(',')
		}
		manyExt.WriteString(`"k":"v"`)
	}
	manyExt.WriteString("}}")

	bin, err := routeRequest().AppendFrame(nil, SerializeRocketMQ)
	if err != nil {
		t.Fatal(err)
	}
	bin = bin[4:] // DecodeFrame takes the frame without its total-length word
	patch := func(off int, val ...byte) []byte {
		b := bytes.Clone(bin)
		copy(b[off:], val)
		return b
	}
	// Offsets in bin: 0 header-length word, 4 code, 6 language, 7 version,
	// 9 opaque, 13 flag, 17 remark length, 21 ext length, 25 key length,
	// 27 key, 32 value length, 36 value.
	manyBinExt := func() []byte {
		c := NewRequest(1)
		for range MaxExtFields + 1 {
			c.appendExt("k", "")
		}
		f, err := c.AppendFrame(nil, SerializeRocketMQ)
		if err != nil {
			t.Fatal(err)
		}
		return f[4:]
	}()

	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"empty", nil},
		{"short length word", []byte{0, 0, 0}},
		{"header beyond frame", []byte{0, 0, 0, 5, '{', '}'}},
		{"huge header length", []byte{1, 0xff, 0xff, 0xff}},
		{"serialize type 2", []byte{2, 0, 0, 0}},
		{"serialize type 255", []byte{255, 0, 0, 2, '{', '}'}},
		{"json empty header", jsonFrame("")},
		{"json not object", jsonFrame(`[]`)},
		{"json truncated", jsonFrame(`{"code":1`)},
		{"json trailing garbage", jsonFrame(`{"code":1}x`)},
		{"json two objects", jsonFrame(`{}{}`)},
		{"json trailing comma", jsonFrame(`{"code":1,}`)},
		{"json missing colon", jsonFrame(`{"code" 1}`)},
		{"json unquoted key", jsonFrame(`{code:1}`)},
		{"json code string", jsonFrame(`{"code":"1"}`)},
		{"json code fraction", jsonFrame(`{"code":1.0}`)},
		{"json code exponent", jsonFrame(`{"code":1e2}`)},
		{"json code too big", jsonFrame(`{"code":2147483648}`)},
		{"json code too small", jsonFrame(`{"code":-2147483649}`)},
		{"json code huge", jsonFrame(`{"code":99999999999999999999999}`)},
		{"json leading zero", jsonFrame(`{"code":01}`)},
		{"json language range", jsonFrame(`{"language":256}`)},
		{"json language negative", jsonFrame(`{"language":-1}`)},
		{"json language object", jsonFrame(`{"language":{}}`)},
		{"json remark number", jsonFrame(`{"remark":1}`)},
		{"json extFields array", jsonFrame(`{"extFields":[]}`)},
		{"json ext value object", jsonFrame(`{"extFields":{"a":{}}}`)},
		{"json ext value array", jsonFrame(`{"extFields":{"a":[]}}`)},
		{"json ext bad number", jsonFrame(`{"extFields":{"a":1.}}`)},
		{"json ext bad literal", jsonFrame(`{"extFields":{"a":tru}}`)},
		{"json unterminated string", jsonFrame(`{"remark":"abc`)},
		{"json unterminated escaped string", jsonFrame(`{"remark":"a\n`)},
		{"json bad escape", jsonFrame(`{"remark":"\x"}`)},
		{"json short unicode escape", jsonFrame(`{"remark":"\u12"}`)},
		{"json bad unicode escape", jsonFrame(`{"remark":"\u12g4"}`)},
		{"json raw control char", jsonFrame("{\"remark\":\"a\x01\"}")},
		{"json bad literal", jsonFrame(`{"x":nul}`)},
		{"json deep nesting", jsonFrame(deep)},
		{"json deep arrays", jsonFrame(`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`)},
		{"json too many ext fields", jsonFrame(manyExt.String())},
		{"binary truncated fixed part", bin[:4+20]},
		{"binary remark length negative", patch(17, 0x80, 0, 0, 0)},
		{"binary remark length lies", patch(17, 0, 0, 0, 20)},
		{"binary ext length short", patch(21, 0, 0, 0, 11)},
		{"binary ext length long", patch(21, 0, 0, 0, 13)},
		{"binary ext length negative", patch(21, 0xff, 0xff, 0xff, 0xff)},
		{"binary key length negative", patch(25, 0x80, 0x00)},
		{"binary key length lies", patch(25, 0x00, 0x08)},
		{"binary value length lies", patch(32, 0, 0, 0, 2)},
		{"binary value length negative", patch(32, 0xff, 0xff, 0xff, 0xff)},
		{"binary header length short", patch(0, 1, 0, 0, 32)},
		{"binary too many ext fields", manyBinExt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DecodeFrame(bytes.Clone(tc.frame))
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("got %v, %v; want ErrMalformedFrame", c, err)
			}
		})
	}
}

func TestReadFrameLengths(t *testing.T) {
	word := func(n uint32, rest ...byte) io.Reader {
		return bytes.NewReader(append(binary.BigEndian.AppendUint32(nil, n), rest...))
	}
	for _, tc := range []struct {
		name     string
		r        io.Reader
		max      int
		want     []error
		wantNot  error
		wantExac error
	}{
		{name: "zero", r: word(0), want: []error{ErrMalformedFrame}, wantNot: ErrFrameTooLarge},
		{name: "three", r: word(3, 0, 0, 0), want: []error{ErrMalformedFrame}},
		{name: "negative", r: word(0x80000000), want: []error{ErrMalformedFrame}, wantNot: ErrFrameTooLarge},
		{name: "all ones", r: word(0xffffffff), want: []error{ErrMalformedFrame}},
		{name: "above default", r: word(DefaultMaxFrameSize + 1), want: []error{ErrMalformedFrame, ErrFrameTooLarge}},
		{name: "above max", r: word(101), max: 100, want: []error{ErrMalformedFrame, ErrFrameTooLarge}},
		{name: "huge", r: word(0x7fffffff), want: []error{ErrFrameTooLarge}},
		{name: "clean EOF", r: bytes.NewReader(nil), wantExac: io.EOF},
		{name: "EOF in length", r: bytes.NewReader([]byte{0, 0}), want: []error{io.ErrUnexpectedEOF}},
		{name: "EOF in frame", r: word(10, 0, 0, 0, 2, '{'), want: []error{io.ErrUnexpectedEOF}},
		{name: "reader error", r: iotest.ErrReader(io.ErrClosedPipe), want: []error{io.ErrClosedPipe}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ReadFrame(tc.r, tc.max)
			if c != nil || err == nil {
				t.Fatalf("got %v, %v", c, err)
			}
			if tc.wantExac != nil && err != tc.wantExac {
				t.Fatalf("got %v, want exactly %v", err, tc.wantExac)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("%v does not wrap %v", err, w)
				}
			}
			if tc.wantNot != nil && errors.Is(err, tc.wantNot) {
				t.Errorf("%v wraps %v", err, tc.wantNot)
			}
		})
	}
}

// TestReadFrameShortReads reads back-to-back frames through a reader that
// returns one byte at a time.
func TestReadFrameShortReads(t *testing.T) {
	var stream []byte
	var want []*Command
	for i, st := range []SerializeType{SerializeJSON, SerializeRocketMQ, SerializeJSON} {
		c := routeRequest()
		c.Opaque = int32(i)
		c.Remark = "r\x00\"é"
		c.Body = []byte{byte(i), 1, 2}
		want = append(want, c)
		var err error
		if stream, err = c.AppendFrame(stream, st); err != nil {
			t.Fatal(err)
		}
	}
	r := iotest.OneByteReader(bytes.NewReader(stream))
	for i, w := range want {
		c, err := ReadFrame(r, 1024)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !commandsEqual(c, w) {
			t.Fatalf("frame %d: got %s want %s", i, dumpCommand(c), dumpCommand(w))
		}
	}
	if _, err := ReadFrame(r, 1024); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

func TestAppendFrameErrors(t *testing.T) {
	prefix := []byte("keep")
	for _, tc := range []struct {
		name string
		c    *Command
		st   SerializeType
		want error
	}{
		{"unknown serialize type", NewRequest(1), 2, ErrUnencodable},
		{"binary pop code", NewRequest(200050), SerializeRocketMQ, ErrUnencodable},
		{"binary negative code", NewRequest(-40000), SerializeRocketMQ, ErrUnencodable},
		{"binary version", &Command{Version: 40000}, SerializeRocketMQ, ErrUnencodable},
		{"binary long key", func() *Command {
			c := NewRequest(1)
			c.SetExt(strings.Repeat("k", 1<<15), "v")
			return c
		}(), SerializeRocketMQ, ErrUnencodable},
		{"header too long", func() *Command {
			c := NewRequest(1)
			c.Remark = strings.Repeat("r", MaxHeaderLength)
			return c
		}(), SerializeJSON, ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.c.AppendFrame(prefix, tc.st)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if string(got) != "keep" {
				t.Fatalf("dst changed to %d bytes", len(got))
			}
		})
	}
	// The largest codes that fit still encode in binary.
	for _, code := range []int32{math.MaxInt16, math.MinInt16, -1000} {
		f, err := NewRequest(code).AppendFrame(nil, SerializeRocketMQ)
		if err != nil {
			t.Fatal(err)
		}
		c, err := DecodeFrame(f[4:])
		if err != nil || c.Code != code {
			t.Fatalf("code %d: got %v, %v", code, c, err)
		}
	}
}

// TestJSONEscaping checks the escapes the encoder writes and that they
// decode back.
func TestJSONEscaping(t *testing.T) {
	c := NewRequest(1)
	c.Remark = "q\"b\\s/\x00\x01\x02\x1f\x7fé\xff"
	c.SetExt("properties", "TAGS\x01TagA\x02")
	f, err := c.AppendFrame(nil, SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"remark":"q\"b\\s/\u0000\u0001\u0002\u001f` + "\x7fé\xff\"", `"properties":"TAGS\u0001TagA\u0002"`} {
		if !bytes.Contains(f, []byte(want)) {
			t.Errorf("frame %s lacks %s", f[8:], want)
		}
	}
	d, err := DecodeFrame(f[4:])
	if err != nil {
		t.Fatal(err)
	}
	if !commandsEqual(c, d) {
		t.Fatalf("got %s want %s", dumpCommand(d), dumpCommand(c))
	}
}

// TestLanguageJSON checks every language code's JSON form.
func TestLanguageJSON(t *testing.T) {
	for l := range 256 {
		c := &Command{Language: LanguageCode(l)}
		f, err := c.AppendFrame(nil, SerializeJSON)
		if err != nil {
			t.Fatal(err)
		}
		d, err := DecodeFrame(f[4:])
		if err != nil {
			t.Fatal(err)
		}
		if d.Language != c.Language {
			t.Fatalf("language %d came back as %d", l, d.Language)
		}
		if LanguageCode(l).Known() {
			if n, ok := ParseLanguage(LanguageCode(l).String()); !ok || n != LanguageCode(l) {
				t.Fatalf("ParseLanguage(%v) = %v, %v", LanguageCode(l), n, ok)
			}
		}
	}
	if LanguageGo.String() != "GO" || LanguageNodeJS.String() != "NODE_JS" || LanguageCode(14).String() != "LanguageCode(14)" {
		t.Fatal("String names")
	}
}

// TestRoundTripCommands round-trips assorted commands through both encodings.
func TestRoundTripCommands(t *testing.T) {
	big := NewRequest(11)
	for i := range 40 { // beyond the inline extField capacity
		big.SetExt(strings.Repeat("k", i+1), strings.Repeat("v\x02", i))
	}
	for _, c := range []*Command{
		routeRequest(),
		{},
		{Code: -1, Language: 200, Version: -2, Opaque: math.MinInt32, Flag: -1, Remark: "é\n", Body: []byte{0}},
		big,
	} {
		for _, st := range []SerializeType{SerializeJSON, SerializeRocketMQ} {
			f, err := c.AppendFrame(nil, st)
			if err != nil {
				t.Fatal(err)
			}
			if got := binary.BigEndian.Uint32(f); int(got) != len(f)-4 {
				t.Fatalf("total length %d for %d bytes", got, len(f))
			}
			d, err := DecodeFrame(f[4:])
			if err != nil {
				t.Fatal(err)
			}
			if !commandsEqual(c, d) {
				t.Fatalf("st %d: got %s want %s", st, dumpCommand(d), dumpCommand(c))
			}
		}
	}
}
