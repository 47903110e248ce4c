package etl

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
)

// orderBodies are inputs of DecodeOrder: the plain form and every kind of
// deviation from it, JSON or not.
var orderBodies = []string{
	`{"id":"o1","customer":"c1","amount":12.5,"currency":"EUR","ts":"2025-01-01T00:00:00Z"}`,
	` { "id" : "o1" ,	"customer":"c1",
	"amount": 1e2, "currency":"EUR" } `,
	`{}`,
	` {} `,
	`{"amount":0}`,
	`{"amount":-0}`,
	`{"amount":-0.5E-3}`,
	`{"amount":1e400}`,
	`{"amount":01}`,
	`{"amount":.5}`,
	`{"amount":5.}`,
	`{"amount":+5}`,
	`{"amount":-}`,
	`{"amount":1e}`,
	`{"amount":"12"}`,
	`{"amount":null}`,
	`{"amount":true}`,
	`{"id":null}`,
	`{"id":12}`,
	`{"id":"a\"b"}`,
	`{"id":"a\u00e9"}`,
	`{"id":"é","customer":"日本"}`,
	"{\"id\":\"\xff\"}",
	"{\"id\":\"a\tb\"}",
	`{"ID":"o1"}`,
	`{"Customer":"c1","customer":"c2"}`,
	`{"id":"o1","id":"o2"}`,
	`{"id":"o1","extra":{"a":[1,2]}}`,
	`{"id":"o1",}`,
	`{"id":"o1"`,
	`{"id":"o1"}x`,
	`{"id":"o1"}{}`,
	`{"id" "o1"}`,
	`{"id":"o1" "customer":"c1"}`,
	`{,"id":"o1"}`,
	`{"":"x"}`,
	`[]`,
	`null`,
	`not json o1`,
	``,
	`"id"`,
	"\xef\xbb\xbf{}",
}

// TestDecodeOrderMatchesJSON checks that DecodeOrder accepts exactly what
// encoding/json accepts and decodes it to the same Order, with two
// documented differences: keys match their field's name exactly (encoding/json
// also takes "ID" for "id"), and bytes of a string that are not UTF-8 are
// kept (encoding/json replaces them with U+FFFD).
func TestDecodeOrderMatchesJSON(t *testing.T) {
	for _, body := range orderBodies {
		checkDecode(t, []byte(body))
	}
	for _, s := range SampleOrders(2000, 50, 5, 7) {
		checkDecode(t, s.Body)
	}
	// The difference, pinned.
	o, err := DecodeOrder(srcmq.Message{Body: []byte(`{"ID":"o1","id":"o2","Customer":"c1"}`)})
	if err != nil || o.ID != "o2" || o.Customer != "" {
		t.Errorf("other casings of keys: %+v, %v; want them ignored", o, err)
	}
}

func checkDecode(t *testing.T, body []byte) {
	t.Helper()
	var want Order
	werr := json.Unmarshal(body, &want)
	got, err := DecodeOrder(srcmq.Message{Body: body, Topic: "in", BrokerName: "b", QueueID: 2, QueueOffset: 9})
	if (err != nil) != (werr != nil) {
		t.Errorf("%q: error %v, encoding/json's %v", body, err, werr)
		return
	}
	if err != nil {
		return
	}
	if got.Src.Topic != "in" || got.Src.Broker != "b" || got.Src.Queue != 2 || got.Src.Offset != 9 {
		t.Fatalf("%q: lineage %+v", body, got.Src)
	}
	if otherCasing(body) || !utf8.Valid(body) {
		return // the documented differences
	}
	got.Src = want.Src
	if got.ID != want.ID || got.Customer != want.Customer || got.Currency != want.Currency || got.TS != want.TS ||
		math.Float64bits(got.Amount) != math.Float64bits(want.Amount) {
		t.Errorf("%q: decoded %+v, encoding/json %+v", body, got, want)
	}
}

// otherCasing reports whether body is an object with a key that names a
// field of Order in another casing.
func otherCasing(body []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return false
	}
	for k := range m {
		for _, f := range []string{"id", "customer", "amount", "currency", "ts"} {
			if k != f && strings.EqualFold(k, f) {
				return true
			}
		}
	}
	return false
}

// FuzzDecodeOrder compares DecodeOrder with encoding/json on arbitrary
// bodies.
func FuzzDecodeOrder(f *testing.F) {
	for _, b := range orderBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkDecode(t, body) })
}

// TestDecodeOrderAllocs bounds DecodeOrder to one allocation per string
// field of the order (easyjson copies each out of the body).
func TestDecodeOrderAllocs(t *testing.T) {
	m := srcmq.Message{Body: []byte(`{"id":"o1","customer":"c1","amount":12.5,"currency":"EUR","ts":"2025-01-01T00:00:00Z"}`)}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeOrder(m); err != nil {
			t.Fatal(err)
		}
	}); n > 4 {
		t.Errorf("DecodeOrder: %v allocations, want at most 4", n)
	}
}

// TestOutputMessage checks the output message of an enriched order: body,
// key, sharding key and lineage properties.
func TestOutputMessage(t *testing.T) {
	e := &Enriched{Order: Order{ID: "o7", Customer: "c3", Amount: 12.5, Currency: "USD", TS: "2025-01-01T00:00:00Z"},
		CustomerOrderCount: 4, AmountEUR: EUR(12.5, "USD")}
	e.Src.Topic, e.Src.Broker, e.Src.Queue, e.Src.Offset = "orders", "broker-a", 3, 123456
	m := OutputMessage("out", e)
	want := `{"customer_order_count":4,"amount_eur":11.5,"id":"o7","customer":"c3","amount":12.5,"currency":"USD","ts":"2025-01-01T00:00:00Z"}`
	if m.Topic != "out" || string(m.Body) != want || len(m.Keys) != 1 || m.Keys[0] != "o7" || m.ShardingKey != "c3" {
		t.Fatalf("message %+v body %s", m, m.Body)
	}
	props := map[string]string{"runnel.src.topic": "orders", "runnel.src.broker": "broker-a", "runnel.src.queue": "3",
		"runnel.src.offset": strconv.Itoa(123456)}
	for k, v := range props {
		if m.Properties[k] != v {
			t.Errorf("property %s = %q, want %q", k, m.Properties[k], v)
		}
	}
	// An unknown currency: amount_eur is null.
	unknown := *e
	unknown.Currency, unknown.AmountEUR = "XXX", EUR(1, "XXX")
	if m = OutputMessage("out", &unknown); !strings.Contains(string(m.Body), `"amount_eur":null`) {
		t.Fatalf("unknown currency: body %s", m.Body)
	}
	// A body longer than the inline buffer still comes out whole.
	long := *e
	long.ID = "o" + strings.Repeat("x", 300)
	m = OutputMessage("out", &long)
	var back map[string]any
	if err := json.Unmarshal(m.Body, &back); err != nil || back["id"] != long.ID {
		t.Fatalf("long body %s: %v", m.Body, err)
	}
	// Appending to the body does not write into the message's storage.
	m = OutputMessage("out", e)
	_ = append(m.Body, "garbage"...)
	if string(m.Body) != want {
		t.Fatalf("body changed by an append: %s", m.Body)
	}
}

// BenchmarkDecodeOrder and BenchmarkOutputMessage are the job's codec per
// record (BenchmarkETL measures the whole job).
func BenchmarkDecodeOrder(b *testing.B) {
	m := srcmq.Message{Body: []byte(`{"id":"o123456","customer":"c42","amount":12.5,"currency":"EUR","ts":"2025-01-01T00:00:00Z"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeOrder(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOutputMessage(b *testing.B) {
	e := &Enriched{Order: Order{ID: "o123456", Customer: "c42", Amount: 12.5, Currency: "USD", TS: "2025-01-01T00:00:00Z"},
		CustomerOrderCount: 4, AmountEUR: EUR(12.5, "USD")}
	b.ReportAllocs()
	for b.Loop() {
		_ = OutputMessage("out", e)
	}
}
