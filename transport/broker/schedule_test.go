package broker

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestBrokerScheduleDelayLevel(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "p")
	resp := c.send(t, protocol.ReqSendMessage, "T", 1, "later", map[string]string{"DELAY": "3", "TAGS": "x", "TIMER_DELAY_SEC": "5"}, 0, 0)
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("send: %d %q", resp.Code, resp.Remark)
	}
	s := subMessages(t, b, topicSchedule, 2)
	if len(s) != 1 {
		t.Fatalf("schedule queue 2 holds %d", len(s))
	}
	// DELAY wins over a timer property, which is dropped.
	wantProps(t, &s[0], "REAL_TOPIC", "T", "REAL_QID", "1", "DELAY", "3", "TIMER_DELAY_SEC", "")
	delivered := func() int { return len(subMessages(t, b, "T", 1)) }
	subNever(t, 300*time.Millisecond, func() bool { return delivered() > 0 }, "delay level 3 delivery")
	clk.advance(8 * time.Second)
	subNever(t, 300*time.Millisecond, func() bool { return delivered() > 0 }, "delivery before 10 s")
	clk.advance(2500 * time.Millisecond)
	subWaitHolds(t, b, "T", 1, 1)
	m := subMessages(t, b, "T", 1)[0]
	if string(m.Body) != "later" {
		t.Errorf("body %q", m.Body)
	}
	wantProps(t, &m, "DELAY", "", "REAL_TOPIC", "T", "REAL_QID", "1", "TAGS", "x",
		propScheduledFrom, strconv.FormatInt(s[0].CommitLogOffset, 10))

	// A level beyond 18 is clamped to 18 (2 h).
	c.send(t, protocol.ReqSendMessage, "T", 0, "clamped", map[string]string{"DELAY": "99"}, 0, 0)
	if s := subMessages(t, b, topicSchedule, 17); len(s) != 1 {
		t.Fatalf("schedule queue 17 holds %d", len(s))
	} else {
		wantProps(t, &s[0], "DELAY", "18")
	}
	// DELAY 0, negative or garbage: stored at once.
	for _, d := range []string{"0", "-1", "x"} {
		c.send(t, protocol.ReqSendMessage, "T", 2, "now", map[string]string{"DELAY": d}, 0, 0)
	}
	if n := len(subMessages(t, b, "T", 2)); n != 3 {
		t.Errorf("T/2 holds %d, want 3", n)
	}
}

func TestBrokerScheduleTimer(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	b := subBroker(t, t.TempDir(), clk)
	c := subDial(t, b, "p")
	at := clk.now().Add(90 * time.Second).UnixMilli()
	for _, p := range []map[string]string{
		{"TIMER_DELAY_SEC": "30"},
		{"TIMER_DELAY_MS": "60000"},
		{"TIMER_DELIVER_MS": strconv.FormatInt(at, 10)},
	} {
		var name string
		for k := range p {
			name = k
		}
		if resp := c.send(t, protocol.ReqSendMessage, "T", 0, name, p, 0, 0); resp.Code != protocol.ResSuccess {
			t.Fatalf("send %v: %d %q", p, resp.Code, resp.Remark)
		}
	}
	timed := subMessages(t, b, timerTopic, 0)
	if len(timed) != 3 {
		t.Fatalf("timer topic holds %d", len(timed))
	}
	wantProps(t, &timed[2], "REAL_TOPIC", "T", "REAL_QID", "0", "TIMER_OUT_MS", strconv.FormatInt(at-at%1000, 10))
	delivered := func() int { return len(subMessages(t, b, "T", 0)) }
	subNever(t, 300*time.Millisecond, func() bool { return delivered() > 0 }, "timer delivery")
	clk.advance(31 * time.Second)
	subWaitHolds(t, b, "T", 0, 1)
	subNever(t, 300*time.Millisecond, func() bool { return delivered() > 1 }, "second timer delivery")
	clk.advance(30 * time.Second)
	subWaitHolds(t, b, "T", 0, 2)
	clk.advance(30 * time.Second)
	subWaitHolds(t, b, "T", 0, 3)
	got := subMessages(t, b, "T", 0)
	for i, want := range []string{"TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_DELIVER_MS"} {
		if string(got[i].Body) != want {
			t.Errorf("message %d is %q, want %q (deliver-time order)", i, got[i].Body, want)
		}
		wantProps(t, &got[i], "TIMER_OUT_MS", "", want, "", "REAL_TOPIC", "T")
	}

	// Illegal timers.
	for _, p := range []map[string]string{
		{"TIMER_DELAY_SEC": strconv.Itoa(4 * 24 * 3600)}, // beyond 3 days
		{"TIMER_DELAY_MS": "soon"},
		{"TIMER_DELIVER_MS": "1e9"},
	} {
		if resp := c.send(t, protocol.ReqSendMessage, "T", 0, "bad", p, 0, 0); resp.Code != protocol.ResMessageIllegal {
			t.Errorf("timer %v: code %d, want MESSAGE_ILLEGAL", p, resp.Code)
		}
	}
	// A deliver time in the past: stored at once.
	c.send(t, protocol.ReqSendMessage, "T", 1, "past", map[string]string{"TIMER_DELIVER_MS": "1000"}, 0, 0)
	if n := len(subMessages(t, b, "T", 1)); n != 1 {
		t.Errorf("past timer: T/1 holds %d", n)
	}
}

// TestBrokerScheduleRestart schedules delay-level and timer messages, stops
// the broker before they are due, and checks each is delivered exactly once
// by the next broker on the same data.
func TestBrokerScheduleRestart(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := subBroker(t, dir, clk)
	c := subDial(t, b, "p")
	c.send(t, protocol.ReqSendMessage, "T", 0, "level", map[string]string{"DELAY": "3"}, 0, 0)
	c.send(t, protocol.ReqSendMessage, "T", 0, "timer", map[string]string{"TIMER_DELAY_SEC": "20"}, 0, 0)
	// Let the scheduler index the timer message before the stop.
	subEventually(t, 5*time.Second, func() error {
		n := 0
		err := b.store.ScanMeta([]byte(metaTimerDue), func(_, _ []byte) bool { n++; return true })
		if err == nil && n != 1 {
			err = fmt.Errorf("%d timer index entries", n)
		}
		return err
	})
	_ = c.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b2 := subBroker(t, dir, clk)
	subNever(t, 300*time.Millisecond, func() bool { return len(subMessages(t, b2, "T", 0)) > 0 }, "delivery after restart")
	clk.advance(21 * time.Second)
	subWaitHolds(t, b2, "T", 0, 2)
	// Give a duplicate delivery time to happen.
	subNever(t, 500*time.Millisecond, func() bool { return len(subMessages(t, b2, "T", 0)) > 2 }, "duplicate delivery")
}

// TestBrokerScheduleCrashWindow simulates a crash between a delivery and
// its progress write: the progress (and the timer index entry) are put back
// as they were before the delivery, and the next broker must not deliver
// again.
func TestBrokerScheduleCrashWindow(t *testing.T) {
	subLeakCheck(t)
	clk := &subClock{}
	dir := t.TempDir()
	b := subBroker(t, dir, clk)
	c := subDial(t, b, "p")
	c.send(t, protocol.ReqSendMessage, "T", 0, "level", map[string]string{"DELAY": "3"}, 0, 0)
	c.send(t, protocol.ReqSendMessage, "T", 0, "timer", map[string]string{"TIMER_DELAY_SEC": "10"}, 0, 0)
	// Capture the timer index entry before its delivery deletes it.
	var key, val []byte
	subEventually(t, 5*time.Second, func() error {
		err := b.store.ScanMeta([]byte(metaTimerDue), func(k, v []byte) bool {
			key, val = append([]byte(nil), k...), append([]byte(nil), v...)
			return false
		})
		if err == nil && key == nil {
			err = fmt.Errorf("timer not indexed yet")
		}
		return err
	})
	clk.advance(11 * time.Second)
	subWaitHolds(t, b, "T", 0, 2)
	_ = c.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// Rewind: level 3's progress back to 0, the timer entry restored.
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutMeta(levelKey(2), make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if err := st.PutMeta(key, val); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	b2 := subBroker(t, dir, clk)
	subEventually(t, 5*time.Second, func() error {
		p, _, err := b2.store.GetMeta(levelKey(2))
		if err != nil {
			return err
		}
		n := 0
		if err := b2.store.ScanMeta([]byte(metaTimerDue), func(_, _ []byte) bool { n++; return true }); err != nil {
			return err
		}
		if p == nil || p[7] != 1 || n != 0 {
			return fmt.Errorf("scheduler has not caught up: progress %v, %d timer entries", p, n)
		}
		return nil
	})
	if n := len(subMessages(t, b2, "T", 0)); n != 2 {
		t.Fatalf("after the simulated crash T/0 holds %d messages, want 2 (no duplicates)", n)
	}
}

func BenchmarkBeforeStorePlain(b *testing.B) {
	clk := &subClock{}
	br := subBroker(b, b.TempDir(), clk)
	s := newSubsystems(br, defaultSubsystemConfig())
	props := string(protocol.AppendProperties(nil, map[string]string{"TAGS": "a", "KEYS": "k", "UNIQ_KEY": "0A0000090001000000000000DEAD0001", "CLUSTER": "DefaultCluster"}))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m := InboundMessage{Topic: "T", Properties: props, MaxReconsumeTimes: -1}
		if err := s.beforeStore(ctx, &m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBeforeStoreDelay(b *testing.B) {
	clk := &subClock{}
	br := subBroker(b, b.TempDir(), clk)
	s := newSubsystems(br, defaultSubsystemConfig())
	props := string(protocol.AppendProperties(nil, map[string]string{"TAGS": "a", "DELAY": "3", "UNIQ_KEY": "0A0000090001000000000000DEAD0001"}))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m := InboundMessage{Topic: "T", Properties: props, MaxReconsumeTimes: -1}
		if err := s.beforeStore(ctx, &m); err != nil {
			b.Fatal(err)
		}
	}
}
