package broker

import (
	"context"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestBrokerRetention: a retention pass removes the messages stored
// before now minus the retention, in steps, and keeps the rest readable; a
// consumer below the new min offset is told OFFSET_MOVED to it; the
// delay-level queue keeps a waiting message until it has been due for the
// retention; a retention of 0 keeps everything (the control); a negative
// one is refused.
func TestBrokerRetention(t *testing.T) {
	subLeakCheck(t)
	ctx := context.Background()
	for _, keepAll := range []bool{false, true} {
		clk := &subClock{}
		ret := time.Hour
		if keepAll {
			ret = 0
		}
		b := subBroker(t, t.TempDir(), clk, WithRetention(ret), WithDelayLevels([]time.Duration{24 * time.Hour}))
		c := dial(t, b.Addr())
		const old = retentionStep + 10 // more than one step
		for i := range old {
			send(t, c, "RetT", 0, []byte{byte(i)}, "")
		}
		send(t, c, "RetT", 1, []byte("old, other queue"), "")
		send(t, c, "RetDelay", 0, []byte("waits a day"), props(protocol.PropDelayLevel, "1"))
		clk.advance(2 * time.Hour)
		send(t, c, "RetT", 0, []byte("new-0"), "")
		send(t, c, "RetT", 0, []byte("new-1"), "")

		removed, err := b.retainOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		minOff, err := b.store.MinOffset("RetT", 0)
		if err != nil {
			t.Fatal(err)
		}
		min1, _ := b.store.MinOffset("RetT", 1)
		sched, _ := b.store.MinOffset(topicSchedule, 0)
		schedMax, _ := b.store.MaxOffset(topicSchedule, 0)
		if keepAll {
			if removed != 0 || minOff != 0 || min1 != 0 {
				t.Fatalf("retention 0 removed %d; min offsets %d, %d", removed, minOff, min1)
			}
			continue
		}
		if removed != old+1 || minOff != old || min1 != 1 {
			t.Fatalf("removed %d (want %d); min offsets %d (want %d), %d (want 1)", removed, old+1, minOff, old, min1)
		}
		if sched != 0 || schedMax != 1 {
			t.Fatalf("the delay-level queue holds [%d, %d), want its waiting message", sched, schedMax)
		}
		r := pull(t, c, pullArgs{topic: "RetT", offset: 0, max: 32})
		if r.code != protocol.ResPullOffsetMoved || r.h.NextBeginOffset != old || r.h.MinOffset != old {
			t.Fatalf("pull below the min: code %d header %+v", r.code, r.h)
		}
		r = pull(t, c, pullArgs{topic: "RetT", offset: old, max: 32})
		if r.code != protocol.ResSuccess || len(r.msgs) != 2 || string(r.msgs[0].Body) != "new-0" || string(r.msgs[1].Body) != "new-1" {
			t.Fatalf("kept messages: code %d, %d messages", r.code, len(r.msgs))
		}
		// Nothing more has expired: a second pass removes nothing.
		if n, err := b.retainOnce(ctx); err != nil || n != 0 {
			t.Fatalf("second pass: removed %d, %v", n, err)
		}
		// A day later the delayed message is due; it stays in its queue
		// for the retention after that, then goes.
		clk.advance(22*time.Hour + 30*time.Minute) // due half an hour ago
		if _, err := b.retainOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if m, _ := b.store.MinOffset(topicSchedule, 0); m != 0 {
			t.Fatal("the delay-level message was removed before a retention had passed since it was due")
		}
		clk.advance(time.Hour)
		if _, err := b.retainOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if m, _ := b.store.MinOffset(topicSchedule, 0); m != 1 {
			t.Fatalf("the delay-level queue starts at %d a retention after its message was due, want 1", m)
		}
	}
	if _, err := New(WithDataDir(t.TempDir()), WithRetention(-time.Second)); err == nil {
		t.Error("a negative retention was accepted")
	}
}
