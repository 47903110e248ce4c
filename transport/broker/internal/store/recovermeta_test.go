package store

import (
	"testing"
)

// TestRecoverCountersWithoutMeta checks what Open recovers now that commit
// rounds write no queue or global meta: each queue's max offset, the
// physical counter (never handing out a physical offset again) and the
// last store timestamp (never going back when the clock does), also after
// TruncateBefore removed every message of the last written queue and after
// DeleteTopic removed the last written topic, the two deletions that take
// away the keys those counters are recovered from.
func TestRecoverCountersWithoutMeta(t *testing.T) {
	dir := t.TempDir()
	var clock testClock
	clock.ms.Store(1_000_000)
	opts := Options{FlushMode: FlushSync, Clock: clock.now}
	s := openTest(t, dir, opts)
	for i := range 5 {
		mustPut(t, s, msg("A", 0, "a"), msg("A", 1, "b"))
		if i < 3 {
			mustPut(t, s, msg("B", 0, "c"))
		}
	}
	last := mustPut(t, s, msg("C", 2, "last"))[0]
	end := last.PhysicalOffset + int64(len(msg("C", 2, "last").Record))

	// checkReopen reopens the store with the clock moved back and checks
	// that the next message lands past end, at or after lastTS.
	checkReopen := func(what string, lastTS int64) {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		clock.ms.Store(500_000)
		s = openTest(t, dir, opts)
		r := mustPut(t, s, msg("D", 0, what))[0]
		if r.PhysicalOffset < end {
			t.Fatalf("%s: physical offset %d handed out again (counter was at %d)", what, r.PhysicalOffset, end)
		}
		if r.StoreTimestamp < lastTS {
			t.Fatalf("%s: store timestamp %d went back before %d", what, r.StoreTimestamp, lastTS)
		}
		end = r.PhysicalOffset + int64(len(msg("D", 0, what).Record))
		clock.ms.Store(r.StoreTimestamp + 1000)
	}

	checkReopen("plain", last.StoreTimestamp)
	for _, c := range []struct {
		topic string
		queue int32
		max   int64
	}{{"A", 0, 5}, {"A", 1, 5}, {"B", 0, 3}, {"C", 2, 1}, {"D", 0, 1}} {
		if got := mustOffset(t, s.MaxOffset, c.topic, c.queue); got != c.max {
			t.Fatalf("%s/%d: max offset %d after reopen, want %d", c.topic, c.queue, got, c.max)
		}
	}

	// Truncate all of the last written queue: its keys, the last physical
	// index entry included, are gone.
	r := mustPut(t, s, msg("E", 0, "e1"), msg("E", 0, "e2"))
	end = r[1].PhysicalOffset + int64(len(msg("E", 0, "e2").Record))
	if err := s.TruncateBefore("E", 0, 2); err != nil {
		t.Fatal(err)
	}
	checkReopen("after truncate", r[1].StoreTimestamp)
	if got := mustOffset(t, s.MaxOffset, "E", 0); got != 2 {
		t.Fatalf("E/0: max offset %d after truncating everything and reopening, want 2", got)
	}
	if got := mustOffset(t, s.MinOffset, "E", 0); got != 2 {
		t.Fatalf("E/0: min offset %d, want 2", got)
	}
	if got := mustPut(t, s, msg("E", 0, "e3"))[0].QueueOffset; got != 2 {
		t.Fatalf("E/0: next message at offset %d, want 2", got)
	}

	// Delete the last written topic.
	r = mustPut(t, s, msg("F", 0, "f1"), msg("F", 3, "f2"))
	end = r[1].PhysicalOffset + int64(len(msg("F", 3, "f2").Record))
	if err := s.DeleteTopic("F"); err != nil {
		t.Fatal(err)
	}
	checkReopen("after delete topic", r[1].StoreTimestamp)
	if got := mustOffset(t, s.MaxOffset, "A", 1); got != 5 {
		t.Fatalf("A/1: max offset %d, want 5", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
