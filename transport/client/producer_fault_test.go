package client

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func twoBrokerQueues(topic string, perBroker int) []protocol.MessageQueue {
	var qs []protocol.MessageQueue
	for _, b := range []string{"broker-a", "broker-b"} {
		for i := range perBroker {
			qs = append(qs, protocol.MessageQueue{Topic: topic, BrokerName: b, QueueID: int32(i)})
		}
	}
	return qs
}

func TestFaultStrategyTables(t *testing.T) {
	f := newFaultStrategy(true, defaultLatencyMax, defaultNotAvailable)
	for _, tc := range []struct {
		lat  time.Duration
		want time.Duration
	}{
		{0, 0}, {49 * time.Millisecond, 0}, {100 * time.Millisecond, 0}, {549 * time.Millisecond, 0},
		{550 * time.Millisecond, 30 * time.Second}, {time.Second, time.Minute}, {2500 * time.Millisecond, 2 * time.Minute},
		{3 * time.Second, 3 * time.Minute}, {isolationLatency, 3 * time.Minute}, {15 * time.Second, 10 * time.Minute},
		{time.Hour, 10 * time.Minute},
	} {
		if got := f.notAvailableFor(tc.lat); got != tc.want {
			t.Errorf("notAvailableFor(%v) = %v, want %v", tc.lat, got, tc.want)
		}
	}
}

func TestFaultStrategyPick(t *testing.T) {
	now := time.Unix(1700000000, 0)
	f := newFaultStrategy(true, defaultLatencyMax, defaultNotAvailable)
	f.now = func() time.Time { return now }
	qs := twoBrokerQueues("T", 2)

	// Healthy: plain rotation over all queues.
	seen := map[protocol.MessageQueue]int{}
	for i := range uint32(8) {
		seen[f.pick(qs, i, "")]++
	}
	if len(seen) != 4 {
		t.Fatalf("rotation visited %d queues, want 4: %v", len(seen), seen)
	}
	// Retry: avoid the broker that just failed.
	for i := range uint32(4) {
		if q := f.pick(qs, i, "broker-a"); q.BrokerName != "broker-b" {
			t.Fatalf("pick avoiding broker-a returned %s", q)
		}
	}
	// A fast send keeps nothing in the table.
	f.update("broker-a", 10*time.Millisecond, false)
	if len(f.mu.items) != 0 {
		t.Fatalf("fast send recorded an item: %v", f.mu.items)
	}
	// A failure isolates broker-a for 3 minutes.
	f.update("broker-a", 5*time.Millisecond, true)
	if f.available("broker-a") {
		t.Fatal("broker-a available right after a failure")
	}
	for i := range uint32(4) {
		if q := f.pick(qs, i, ""); q.BrokerName != "broker-b" {
			t.Fatalf("pick with broker-a isolated returned %s", q)
		}
	}
	// Both bad: the least bad (available soonest) is chosen, even when it
	// is the broker to avoid.
	f.update("broker-b", 600*time.Millisecond, false) // 30 s
	for i := range uint32(4) {
		if q := f.pick(qs, i, "broker-b"); q.BrokerName != "broker-b" {
			t.Fatalf("least-bad pick returned %s, want broker-b (available in 30s, broker-a in 3m)", q)
		}
	}
	// Time passes: broker-b recovers first, then broker-a.
	now = now.Add(31 * time.Second)
	if !f.available("broker-b") || f.available("broker-a") {
		t.Fatal("after 31s broker-b should be available and broker-a not")
	}
	now = now.Add(3 * time.Minute)
	if !f.available("broker-a") {
		t.Fatal("broker-a still unavailable after its isolation")
	}
	// A healthy send to a known broker clears it at once.
	f.update("broker-a", time.Second, false)
	f.update("broker-a", time.Millisecond, false)
	if !f.available("broker-a") {
		t.Fatal("fast send did not clear broker-a")
	}
}

func TestFaultStrategyDisabled(t *testing.T) {
	f := newFaultStrategy(false, defaultLatencyMax, defaultNotAvailable)
	qs := twoBrokerQueues("T", 2)
	f.update("broker-a", time.Hour, true)
	if !f.available("broker-a") {
		t.Fatal("disabled strategy recorded a fault")
	}
	if q := f.pick(qs, 0, "broker-a"); q.BrokerName != "broker-b" {
		t.Fatalf("disabled strategy still avoids the last broker on retry; got %s", q)
	}
}

func TestSelectors(t *testing.T) {
	qs := twoBrokerQueues("T", 4)
	h := HashBySharding()
	for _, key := range []string{"a", "order-17", "ключ"} {
		first := h.Select(&Message{ShardingKey: key}, qs)
		for range 10 {
			if q := h.Select(&Message{ShardingKey: key}, qs); q != first {
				t.Fatalf("key %q went to %s and %s", key, first, q)
			}
		}
	}
	spread := map[protocol.MessageQueue]bool{}
	for i := range 200 {
		spread[h.Select(&Message{ShardingKey: fmt.Sprint("k", i)}, qs)] = true
	}
	if len(spread) != len(qs) {
		t.Fatalf("200 keys reached %d of %d queues", len(spread), len(qs))
	}
	rr := RoundRobin()
	seen := map[protocol.MessageQueue]bool{}
	for range len(qs) {
		seen[rr.Select(nil, qs)] = true
	}
	if len(seen) != len(qs) {
		t.Fatalf("round robin visited %d of %d queues in one turn", len(seen), len(qs))
	}
	custom := SelectorFunc(func(_ *Message, q []protocol.MessageQueue) protocol.MessageQueue { return q[len(q)-1] })
	if q := custom.Select(nil, qs); q != qs[len(qs)-1] {
		t.Fatalf("SelectorFunc returned %s", q)
	}
}

// TestValidationBeforeSending uses a Client whose only name server cannot be
// reached: a message refused with ErrInvalidMessage was refused before any
// request (a request would fail with ErrNoNameServer).
func TestValidationBeforeSending(t *testing.T) {
	c, err := New(WithNameServers(deadAddr(t)), WithRequestTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := NewProducer(c, "pg")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	body := []byte("x")
	big := make([]byte, DefaultMaxBodySize+1)
	long := strings.Repeat("p", protocol.MaxPropertiesLength)
	bad := map[string][]*Message{
		"empty topic":           {{Body: body}},
		"bad topic chars":       {{Topic: "a b", Body: body}},
		"topic too long":        {{Topic: strings.Repeat("t", 128), Body: body}},
		"system topic":          {{Topic: "SCHEDULE_TOPIC_XXXX", Body: body}},
		"empty body":            {{Topic: "T"}},
		"body too large":        {{Topic: "T", Body: big}},
		"tag with separator":    {{Topic: "T", Body: body, Tags: "a\x01b"}},
		"key with space":        {{Topic: "T", Body: body, Keys: []string{"a b"}}},
		"reserved property":     {{Topic: "T", Body: body, Properties: map[string]string{"UNIQ_KEY": "x"}}},
		"empty property value":  {{Topic: "T", Body: body, Properties: map[string]string{"k": ""}}},
		"properties too long":   {{Topic: "T", Body: body, Properties: map[string]string{"k": long}}},
		"negative delay":        {{Topic: "T", Body: body, DelayLevel: -1}},
		"delay and timer":       {{Topic: "T", Body: body, DelayLevel: 1, DeliverTime: time.Now()}},
		"delay and after":       {{Topic: "T", Body: body, DelayLevel: 1, DeliverAfter: time.Second}},
		"timer and after":       {{Topic: "T", Body: body, DeliverTime: time.Now(), DeliverAfter: time.Second}},
		"negative after":        {{Topic: "T", Body: body, DeliverAfter: -time.Second}},
		"batch with after":      {{Topic: "T", Body: body}, {Topic: "T", Body: body, DeliverAfter: time.Second}},
		"queue of other topic":  {{Topic: "T", Body: body, Queue: &protocol.MessageQueue{Topic: "U", BrokerName: "b"}}},
		"batch of two topics":   {{Topic: "T", Body: body}, {Topic: "U", Body: body}},
		"batch with delay":      {{Topic: "T", Body: body}, {Topic: "T", Body: body, DelayLevel: 2}},
		"batch to retry topic":  {{Topic: "%RETRY%g", Body: body}, {Topic: "%RETRY%g", Body: body}},
		"batch too large":       {{Topic: "T", Body: big[:DefaultMaxBodySize/2+1]}, {Topic: "T", Body: big[:DefaultMaxBodySize/2+1]}},
		"nil message":           {nil},
		"no message":            {},
		"half message delayed":  nil, // below
		"batch to two queues":   {{Topic: "T", Body: body, Queue: &protocol.MessageQueue{BrokerName: "a"}}, {Topic: "T", Body: body}},
		"group-less properties": {{Topic: "T", Body: body, Properties: map[string]string{"a\x02": "v"}}},
	}
	ctx := t.Context()
	for name, msgs := range bad {
		if msgs == nil {
			continue
		}
		_, err := p.Send(ctx, msgs...)
		if !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("%s: Send error %v, want ErrInvalidMessage", name, err)
		}
		if MaybeApplied(err) {
			t.Errorf("%s: MaybeApplied(%v) = true", name, err)
		}
	}
	if _, err := p.SendHalf(ctx, &Message{Topic: "T", Body: body, DelayLevel: 1}); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("delayed half message: %v, want ErrInvalidMessage", err)
	}
	if _, err := p.SendHalf(ctx, &Message{Topic: "T", Body: body, DeliverAfter: time.Second}); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("timed half message: %v, want ErrInvalidMessage", err)
	}
	// A valid message gets past validation and fails on the name server.
	_, err = p.Send(ctx, &Message{Topic: "T", Body: body})
	if !errors.Is(err, ErrNoNameServer) || errors.Is(err, ErrInvalidMessage) || MaybeApplied(err) {
		t.Fatalf("valid message: %v, want ErrNoNameServer only", err)
	}
	// Constructor validation.
	for name, g := range map[string]string{"empty": "", "spaces": "a b", "long": strings.Repeat("g", 256)} {
		if _, err := NewProducer(c, g); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("group %s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := NewProducer(c, "pg", WithRetries(-1)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("negative retries: %v", err)
	}
	if _, err := NewProducer(c, "pg", WithFaultTables([]time.Duration{1}, nil)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("uneven fault tables: %v", err)
	}
}

func TestClientOptionValidation(t *testing.T) {
	for name, opts := range map[string][]Option{
		"no name server":      nil,
		"bad address":         {WithNameServers("nohostport")},
		"bad resolver":        {WithNameServerResolver("ftp://x/y")},
		"zero timeout":        {WithNameServers("127.0.0.1:1"), WithRequestTimeout(0)},
		"tiny refresh":        {WithNameServers("127.0.0.1:1"), WithRouteRefreshInterval(time.Nanosecond)},
		"half credentials":    {WithNameServers("127.0.0.1:1"), WithCredentials(Credentials{AccessKey: "ak"})},
		"instance with at":    {WithNameServers("127.0.0.1:1"), WithInstanceName("a@b")},
		"tiny heartbeat":      {WithNameServers("127.0.0.1:1"), WithHeartbeatInterval(time.Microsecond)},
		"negative dial limit": {WithNameServers("127.0.0.1:1"), WithDialTimeout(-1)},
	} {
		if c, err := New(opts...); !errors.Is(err, ErrInvalidOption) {
			if c != nil {
				c.Close()
			}
			t.Errorf("%s: New error %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestDeliverAfterProperty: DeliverAfter goes out as TIMER_DELAY_SEC when
// it is a whole number of seconds and as TIMER_DELAY_MS otherwise (Java's
// Message.setDelayTimeSec / setDelayTimeMs), which the 5.x broker's timer
// reads relative to its own clock.
func TestDeliverAfterProperty(t *testing.T) {
	for _, tc := range []struct {
		after      time.Duration
		key, value string
	}{
		{3 * time.Second, protocol.PropTimerDelaySec, "3"},
		{1500 * time.Millisecond, protocol.PropTimerDelayMS, "1500"},
		{time.Microsecond, protocol.PropTimerDelayMS, "1"},
	} {
		props := string(appendMsgProps(nil, &Message{Topic: "T", Body: []byte("b"), DeliverAfter: tc.after}, []byte("ID")))
		if v, ok := protocol.PropertyValue(props, tc.key); !ok || v != tc.value {
			t.Errorf("DeliverAfter %v: properties %q, want %s=%s", tc.after, props, tc.key, tc.value)
		}
		other := protocol.PropTimerDelayMS
		if tc.key == other {
			other = protocol.PropTimerDelaySec
		}
		if _, ok := protocol.PropertyValue(props, other); ok {
			t.Errorf("DeliverAfter %v: both timer properties in %q", tc.after, props)
		}
	}
}
