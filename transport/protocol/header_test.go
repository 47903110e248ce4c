package protocol

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var testStrings = []string{"", "T", "TopicTest", "é \"q\" \\ \x01\x02\x00", "%RETRY%group", strings.Repeat("x", 300)}

// fillScalar sets a string, int32, int64 or bool field at random.
func fillScalar(r *rand.Rand, f reflect.Value) {
	switch f.Kind() {
	case reflect.String:
		f.SetString(testStrings[r.IntN(len(testStrings))])
	case reflect.Int32:
		f.SetInt(int64(r.Int32()) - int64(r.Int32()))
	case reflect.Int64:
		f.SetInt(r.Int64() - r.Int64())
	case reflect.Bool:
		f.SetBool(r.IntN(2) == 1)
	default:
		panic("unexpected field kind " + f.Kind().String())
	}
}

// fillRandom sets every field of the header struct v: optional (Opt) fields
// are left unset a third of the time.
func fillRandom(r *rand.Rand, v reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Struct {
			fillScalar(r, f)
			continue
		}
		if r.IntN(3) > 0 {
			f.FieldByName("Set").SetBool(true)
			fillScalar(r, f.FieldByName("V"))
		}
	}
}

// TestHeadersRoundTrip encodes every generated header, filled at random,
// into a command, sends it through a frame in both header encodings and
// decodes it back.
func TestHeadersRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, gh := range allHeaders() {
		typ := reflect.TypeOf(gh.h).Elem()
		t.Run(typ.Name(), func(t *testing.T) {
			for i := range 30 {
				h := reflect.New(typ)
				if i > 0 { // the first round checks the zero value
					fillRandom(r, h.Elem())
				}
				for _, st := range []SerializeType{SerializeJSON, SerializeRocketMQ} {
					c := NewRequest(1)
					h.Interface().(CustomHeader).Encode(c)
					frame, err := c.AppendFrame(nil, st)
					if err != nil {
						t.Fatal(err)
					}
					d, err := DecodeFrame(frame[4:])
					if err != nil {
						t.Fatal(err)
					}
					got := reflect.New(typ)
					// Decode must reset: start from garbage.
					fillRandom(r, got.Elem())
					if err := got.Interface().(CustomHeader).Decode(d); err != nil {
						t.Fatalf("st %d: %v", st, err)
					}
					if !reflect.DeepEqual(got.Interface(), h.Interface()) {
						t.Fatalf("st %d:\n got %+v\nwant %+v", st, got.Elem(), h.Elem())
					}
				}
			}
		})
	}
}

// TestHeadersDecodeErrors checks, for every header, that each missing
// required field and each unparsable number is reported, naming its key.
func TestHeadersDecodeErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, gh := range allHeaders() {
		typ := reflect.TypeOf(gh.h).Elem()
		t.Run(typ.Name(), func(t *testing.T) {
			h := reflect.New(typ)
			fillRandom(r, h.Elem())
			for i := range h.Elem().NumField() { // set every field, so that each is encoded
				switch f := h.Elem().Field(i); {
				case f.Kind() == reflect.Struct:
					f.FieldByName("Set").SetBool(true)
				case f.Kind() == reflect.String && f.String() == "":
					f.SetString("s")
				}
			}
			encode := func() *Command {
				c := NewRequest(1)
				h.Interface().(CustomHeader).Encode(c)
				return c
			}
			if n := encode().NumExt(); n != typ.NumField() {
				t.Fatalf("%d extFields for %d fields", n, typ.NumField())
			}
			for i := range typ.NumField() {
				key := encode().ExtAt(i).Key
				field := typ.Field(i)
				c := encode()
				c.DeleteExt(key)
				got := reflect.New(typ)
				err := got.Interface().(CustomHeader).Decode(c)
				if slicesContains(gh.required, key) {
					if !errors.Is(err, ErrBadHeader) || !strings.Contains(err.Error(), `"`+key+`"`) {
						t.Fatalf("without required %s: %v", key, err)
					}
				} else {
					if err != nil {
						t.Fatalf("without optional %s: %v", key, err)
					}
					if !got.Elem().Field(i).IsZero() {
						t.Fatalf("absent optional %s decoded as %v", key, got.Elem().Field(i))
					}
				}
				kind := field.Type.Kind()
				if kind == reflect.Struct {
					kind = field.Type.Field(0).Type.Kind()
				}
				if kind == reflect.Int32 || kind == reflect.Int64 {
					for _, bad := range []string{"", "x", "1.5", "0x10", "99999999999999999999"} {
						c := encode()
						c.SetExt(key, bad)
						err := reflect.New(typ).Interface().(CustomHeader).Decode(c)
						if !errors.Is(err, ErrBadHeader) || !strings.Contains(err.Error(), `"`+key+`"`) {
							t.Fatalf("%s=%q: %v", key, bad, err)
						}
					}
				}
			}
		})
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestParseBool(t *testing.T) {
	for s, want := range map[string]bool{"true": true, "TRUE": true, "tRuE": true, "false": false, "": false, "1": false, "yes": false, " true": false, "truex": false} {
		if got := parseBool(s); got != want {
			t.Errorf("parseBool(%q) = %v", s, got)
		}
	}
	c := NewRequest(ReqQueryConsumerOffset)
	c.SetExt("consumerGroup", "g")
	c.SetExt("topic", "t")
	c.SetExt("queueId", "+3")
	c.SetExt("setZeroIfNotFound", "garbage")
	var h QueryConsumerOffsetRequestHeader
	if err := h.Decode(c); err != nil {
		t.Fatal(err)
	}
	if h.QueueID != 3 || h.SetZeroIfNotFound != Some(false) {
		t.Fatalf("%+v", h)
	}
}

// TestSendHeaderConversions checks ToV1 and ToV2 against each other and that
// the two structs keep the same fields.
func TestSendHeaderConversions(t *testing.T) {
	t1, t2 := reflect.TypeFor[SendMessageRequestHeader](), reflect.TypeFor[SendMessageRequestHeaderV2]()
	if t1.NumField() != t2.NumField() {
		t.Fatalf("V1 has %d fields, V2 %d", t1.NumField(), t2.NumField())
	}
	for i := range t1.NumField() {
		f2, ok := t2.FieldByName(t1.Field(i).Name)
		if !ok || f2.Type != t1.Field(i).Type {
			t.Fatalf("V2 lacks V1 field %s", t1.Field(i).Name)
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 50 {
		var v1 SendMessageRequestHeader
		fillRandom(r, reflect.ValueOf(&v1).Elem())
		v2 := v1.ToV2()
		for i := range t1.NumField() {
			if !reflect.DeepEqual(reflect.ValueOf(v1).Field(i).Interface(), reflect.ValueOf(v2).FieldByName(t1.Field(i).Name).Interface()) {
				t.Fatalf("field %s differs", t1.Field(i).Name)
			}
		}
		if back := v2.ToV1(); back != v1 {
			t.Fatalf("V1 -> V2 -> V1 changed %+v to %+v", v1, back)
		}
	}
}

// TestGoldenHeadersTyped decodes the captured SEND_MESSAGE request and Java
// send response into their typed headers.
func TestGoldenHeadersTyped(t *testing.T) {
	var req SendMessageRequestHeader
	if err := req.Decode(decodeWhole(t, readHexFile(t, "send_message_go_json.hex"))); err != nil {
		t.Fatal(err)
	}
	want := SendMessageRequestHeader{
		ProducerGroup: "pg", Topic: "TopicTest", DefaultTopic: "TBW102", DefaultTopicQueueNums: 4, QueueID: 1,
		BornTimestamp: 1700000000000, Properties: "TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000100002A9F0000000000000001\x02",
		ReconsumeTimes: Some[int32](0), UnitMode: Some(false), Batch: Some(false), MaxReconsumeTimes: Some[int32](0),
		BrokerName: "broker-a",
	}
	if req != want {
		t.Fatalf("got  %+v\nwant %+v", req, want)
	}
	var resp SendMessageResponseHeader
	if err := resp.Decode(decodeWhole(t, readHexFile(t, "send_response_java_json.hex"))); err != nil {
		t.Fatal(err)
	}
	wantResp := SendMessageResponseHeader{MsgID: "7F000001000098370000000000000000", QueueID: 1, QueueOffset: 0,
		TransactionID: "FD00000000000000000000000000000265D54E0E2F2A03671B5D0000", MsgRegion: "DefaultRegion", TraceOn: Some(true)}
	if resp != wantResp {
		t.Fatalf("got  %+v\nwant %+v", resp, wantResp)
	}
}

func TestCodeTables(t *testing.T) {
	for _, tc := range []struct {
		got, want int32
	}{
		{ReqSendMessage, 10}, {ReqPullMessage, 11}, {ReqGetRouteInfoByTopic, 105}, {ReqSendMessageV2, 310},
		{ReqSendBatchMessage, 320}, {ReqHeartbeat, 34}, {ReqPopMessage, 200050}, {ReqChangeMessageInvisibleTime, 200053},
		{ResSuccess, 0}, {ResSystemError, 1}, {ResTopicNotExist, 17}, {ResPullNotFound, 19}, {ResRPCTimeOut, -1006}, {ResGoAway, 1500},
	} {
		if tc.got != tc.want {
			t.Errorf("constant %d, want %d", tc.got, tc.want)
		}
	}
	if n := RequestCodeName(105); n != "GET_ROUTEINFO_BY_TOPIC" {
		t.Error(n)
	}
	if n := ResponseCodeName(17); n != "TOPIC_NOT_EXIST" {
		t.Error(n)
	}
	if RequestCodeName(9999) != "" || ResponseCodeName(9999) != "" {
		t.Error("unknown codes have names")
	}
}

// TestGeneratedUpToDate regenerates the code from the definitions into a
// temporary directory and fails if it differs from the committed files.
func TestGeneratedUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go tool")
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "run", "./internal/gen", "-defs", "definitions", "-out", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, name := range []string{"zz_generated.go", "zz_generated_test.go"} {
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate in transport/protocol", name)
		}
	}
}
