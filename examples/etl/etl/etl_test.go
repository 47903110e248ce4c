package etl

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

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
