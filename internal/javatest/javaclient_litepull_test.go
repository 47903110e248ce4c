package javatest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
)

// TestJavaClientLitePull runs the official Java client's
// DefaultLitePullConsumer against runnel's broker: subscribe mode polls
// part of a topic and commits (commitSync), the committed offsets must be
// the broker's and a new consumer of the group must start there and get
// exactly the rest; assign mode with seek reads from the offsets sought.
func TestJavaClientLitePull(t *testing.T) {
	for _, v := range []string{javapeer.Version5, javapeer.Version4} {
		t.Run(v, func(t *testing.T) { t.Parallel(); testJavaClientLitePull(t, v) })
	}
}

func testJavaClientLitePull(t *testing.T, version string) {
	d := javapeer.RequireVersion(t, version)
	p := startConsumePeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic, group := uniqueName(t, "T"), uniqueName(t, "G")
	qs := testutil.CreateTopic(t, p.client, p.BrokerAddr, topic, 4)
	const n = 40
	sent := p.sendN(t, ctx, qs, 0, n, func(i int) string { return fmt.Sprint("t", i%2) })
	ids := bySent(sent)
	dr := d.NewDriver(t)

	// polled checks a run's deliveries against the sent messages and
	// returns them by id, with the next offset of each queue polled.
	polled := func(r *javaRun) (map[string]bool, map[int32]int64) {
		t.Helper()
		got, next := map[string]bool{}, map[int32]int64{}
		for _, ev := range r.kind("recv") {
			s, ok := ids[ev.Str("id")]
			if !ok {
				t.Fatalf("%s polled a message that was not sent: %v", r.name, ev)
			}
			checkRecv(t, r.name, ev, s)
			if got[s.id] {
				t.Errorf("%s polled message %d twice", r.name, s.i)
			}
			got[s.id] = true
			next[s.queue] = max(next[s.queue], s.off+1)
		}
		return got, next
	}

	// Assign every queue, seek queues 1 and 2: from 0 on queues 0 and 3
	// (no committed offset, consume from first), from 5 and 7 on 1 and 2;
	// in a group of its own, beside the subscribe runs below.
	group2 := uniqueName(t, "G2")
	seek := map[int32]int64{1: 5, 2: 7}
	want := map[string]bool{}
	for _, s := range sent {
		if s.off >= seek[s.queue] {
			want[s.id] = true
		}
	}
	assigned := startJava(t, ctx, dr, p.NameServer, "assign", "litepull", "--topic", topic, "--group", group2,
		"--mode", "assign", "--seek", "1:5,2:7", "--count", strconv.Itoa(len(want)), "--timeout-ms", "60000")

	// Subscribe, poll at least 12 (batches of 3 per queue), commitSync.
	first := startJava(t, ctx, dr, p.NameServer, "first", "litepull", "--topic", topic, "--group", group,
		"--count", "12", "--pull-batch", "3", "--timeout-ms", "60000")
	first.wait(t)
	got1, next1 := polled(first)
	if len(got1) < 12 || len(got1) >= n {
		t.Fatalf("first consumer polled %d messages, want 12 to %d", len(got1), n-1)
	}
	done := first.kind("done")[0]
	committed, _ := done["committed"].(map[string]any)
	onBroker := p.brokerOffsets(t, ctx, group, qs)
	for q, off := range next1 {
		if onBroker[q] != off {
			t.Errorf("queue %d: committed offset on the broker %d, want %d (after the last message polled)", q, onBroker[q], off)
		}
		if c, _ := committed[strconv.Itoa(int(q))].(float64); int64(c) != off {
			t.Errorf("queue %d: the client's committed offset %v, want %d", q, committed[strconv.Itoa(int(q))], off)
		}
	}

	// A new consumer of the group starts at the committed offsets: it
	// gets exactly the messages the first did not poll.
	rest := n - len(got1)
	second := startJava(t, ctx, dr, p.NameServer, "second", "litepull", "--topic", topic, "--group", group,
		"--count", strconv.Itoa(rest), "--timeout-ms", "60000")
	second.wait(t)
	got2, _ := polled(second)
	for id := range got2 {
		if got1[id] {
			t.Errorf("second consumer polled message %d, which the first committed", ids[id].i)
		}
	}
	if len(got2) != rest {
		t.Errorf("second consumer polled %d messages, want the %d the first did not", len(got2), rest)
	}
	if ends, off := p.maxOffsets(t, ctx, qs), p.brokerOffsets(t, ctx, group, qs); !mapsEqual(ends, off) {
		t.Errorf("after the second consumer's commit, offsets on the broker %v, want the queues' ends %v", off, ends)
	}

	assigned.wait(t)
	for _, e := range assigned.kind("seek-retry") {
		t.Logf("assign: seek retried after a timeout: %v", e["error"])
	}
	got3, _ := polled(assigned)
	for id := range got3 {
		if !want[id] {
			t.Errorf("assign: polled message %d (queue %d offset %d), before the offset sought", ids[id].i, ids[id].queue, ids[id].off)
		}
	}
	if len(got3) != len(want) {
		t.Errorf("assign: polled %d messages, want %d", len(got3), len(want))
	}
	if ends, off := p.maxOffsets(t, ctx, qs), p.brokerOffsets(t, ctx, group2, qs); !mapsEqual(ends, off) {
		t.Errorf("assign: offsets on the broker after commitSync %v, want the queues' ends %v", off, ends)
	}
}
