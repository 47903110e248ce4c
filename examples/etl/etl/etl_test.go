package etl

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"

	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
)

// orderBodies are inputs of DecodeOrder: the plain form the fast decoder
// takes and every kind of deviation it must leave to encoding/json.
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

// TestDecodeOrderMatchesJSON checks that DecodeOrder decodes every body as
// encoding/json does (same order, same acceptance), whichever path it takes,
// and that the plain form takes the fast path.
func TestDecodeOrderMatchesJSON(t *testing.T) {
	for _, body := range orderBodies {
		checkDecode(t, []byte(body))
	}
	for _, s := range SampleOrders(2000, 50, 5, 7) {
		checkDecode(t, s.Body)
		if s.Valid {
			if _, ok := decodeOrderFast(s.Body); !ok {
				t.Errorf("sample %q took the slow path", s.Body)
			}
		}
	}
	if _, ok := decodeOrderFast([]byte(orderBodies[0])); !ok {
		t.Errorf("the plain form took the slow path")
	}
}

func checkDecode(t *testing.T, body []byte) {
	t.Helper()
	var want Order
	werr := json.Unmarshal(body, &want)
	got, err := DecodeOrder(srcmq.Message{Body: body, Topic: "in", BrokerName: "b", QueueID: 2, QueueOffset: 9})
	if (err != nil) != (werr != nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", body, err, werr)
	}
	if err != nil {
		return
	}
	if got.Src.Topic != "in" || got.Src.Broker != "b" || got.Src.Queue != 2 || got.Src.Offset != 9 {
		t.Fatalf("%q: lineage %+v", body, got.Src)
	}
	got.Src = want.Src
	if got.ID != want.ID || got.Customer != want.Customer || got.Currency != want.Currency || got.TS != want.TS ||
		math.Float64bits(got.Amount) != math.Float64bits(want.Amount) {
		t.Fatalf("%q: decoded %+v, encoding/json %+v", body, got, want)
	}
}

// FuzzDecodeOrder compares DecodeOrder with encoding/json on arbitrary
// bodies.
func FuzzDecodeOrder(f *testing.F) {
	for _, b := range orderBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkDecode(t, body) })
}

// TestDecodeOrderAllocs bounds the fast path to one allocation (the shared
// copy of the body's strings).
func TestDecodeOrderAllocs(t *testing.T) {
	m := srcmq.Message{Body: []byte(`{"id":"o1","customer":"c1","amount":12.5,"currency":"EUR","ts":"2025-01-01T00:00:00Z"}`)}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeOrder(m); err != nil {
			t.Fatal(err)
		}
	}); n > 1 {
		t.Errorf("DecodeOrder: %v allocations, want at most 1", n)
	}
}

// TestOutputMessage checks the output message of an enriched order: body,
// key, sharding key and lineage properties.
func TestOutputMessage(t *testing.T) {
	e := &Enriched{Order: Order{ID: "o7", Customer: "c3", Amount: 12.5, Currency: "USD", TS: "2025-01-01T00:00:00Z"},
		CustomerOrderCount: 4, AmountEUR: EUR(12.5, "USD")}
	e.Src.Topic, e.Src.Broker, e.Src.Queue, e.Src.Offset = "orders", "broker-a", 3, 123456
	m := OutputMessage("out", e)
	want := `{"id":"o7","customer":"c3","amount":12.5,"currency":"USD","ts":"2025-01-01T00:00:00Z","customer_order_count":4,"amount_eur":11.5}`
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
