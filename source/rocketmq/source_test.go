package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
)

// TestSourceBoundedReadsEverything reads a 4-queue topic bounded at the max
// offsets seen at open: every message exactly once, in queue order, with its
// metadata; messages produced after the open are not read.
func TestSourceBoundedReadsEverything(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("bounded", 4)
	const per = 300
	for q := range 4 {
		msgs := bodies(fmt.Sprintf("q%d-", q), per)
		for i, m := range msgs {
			m.Tags, m.Keys = "t"+strconv.Itoa(i%3), []string{"k" + strconv.Itoa(i)}
			m.Properties = map[string]string{"seq": strconv.Itoa(i)}
		}
		cl.produce("bounded", q, msgs...)
	}
	s, err := New(cl.c, "bounded", WithStop(StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	splits, err := s.Splits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []source.Split{{ID: "broker-a/0"}, {ID: "broker-a/1"}, {ID: "broker-a/2"}, {ID: "broker-a/3"}}
	if !slices.Equal(splits, want) {
		t.Fatalf("splits %v, want %v", splits, want)
	}
	readers := make([]source.SplitReader[Message], 4)
	for i, sp := range splits {
		readers[i] = openSplit(t, s, sp.ID, nil)
	}
	cl.produce("bounded", 0, bodies("late-", 10)...) // after the stop offsets were fixed
	for q, r := range readers {
		got := readAll(t, r, per)
		for i, m := range got {
			if string(m.Body) != fmt.Sprintf("q%d-%d", q, i) || m.QueueOffset != int64(i) || m.QueueID != int32(q) {
				t.Fatalf("queue %d record %d: body %q offset %d queue %d", q, i, m.Body, m.QueueOffset, m.QueueID)
			}
			if m.Tags() != "t"+strconv.Itoa(i%3) || !slices.Equal(m.Keys(), []string{"k" + strconv.Itoa(i)}) {
				t.Fatalf("record %d: tags %q keys %v", i, m.Tags(), m.Keys())
			}
			if v, _ := m.Property("seq"); v != strconv.Itoa(i) || m.Properties()["seq"] != v || m.MsgID() == "" {
				t.Fatalf("record %d: properties %v", i, m.Properties())
			}
			if m.SplitID() != splits[q].ID || m.Topic != "bounded" || time.Since(m.BornTime) > time.Minute || m.StoreTime.IsZero() {
				t.Fatalf("record %d: metadata %+v", i, m)
			}
		}
		if o, _ := DecodeOffset(r.Offset()); o != (Offset{Next: per, End: per}) {
			t.Fatalf("final offset %+v", o)
		}
		// ErrEndOfSplit again on every later call.
		if _, err := r.Poll(ctx, 10); !errors.Is(err, source.ErrEndOfSplit) {
			t.Fatalf("second poll after the end: %v", err)
		}
	}
}

// TestSourceRestoreResumesExactly reads part of a queue, restores a new
// reader from the noted offset, and gets the rest with no gap or repeat;
// the stop offset fixed at the first open survives the restore.
func TestSourceRestoreResumesExactly(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("restore", 1)
	cl.produce("restore", 0, bodies("m", 500)...)
	s, err := New(cl.c, "restore", WithStop(StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	r := openSplit(t, s, "broker-a/0", nil)
	var got []Message
	for len(got) < 123 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		recs, err := r.Poll(ctx, 123-len(got))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for i := range recs {
			got = append(got, recs[i].Value.Clone())
		}
	}
	off := r.Offset()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	cl.produce("restore", 0, bodies("after", 50)...) // beyond the checkpointed stop offset
	r2 := openSplit(t, s, "broker-a/0", off)
	got = append(got, readAll(t, r2, 500-123)...)
	for i, m := range got {
		if string(m.Body) != "m"+strconv.Itoa(i) {
			t.Fatalf("record %d is %q", i, m.Body)
		}
	}
	if _, err := s.Open(context.Background(), source.Split{ID: "broker-a/0"}, []byte{9, 9}); !errors.Is(err, source.ErrBadOffset) {
		t.Fatalf("bad restored offset: %v", err)
	}
	if _, err := s.Open(context.Background(), source.Split{ID: "nonsense"}, nil); !errors.Is(err, ErrInvalidSplit) {
		t.Fatalf("bad split: %v", err)
	}
}

// TestSourceStartPositions covers Latest, AtTimestamp, GroupOffset (with and
// without a committed offset) and explicit Offsets.
func TestSourceStartPositions(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("starts", 2)
	cl.produce("starts", 0, bodies("a", 20)...)
	cl.produce("starts", 1, bodies("b", 20)...)
	ctx := context.Background()

	first := func(t *testing.T, s *Source, id string) string {
		t.Helper()
		r := openSplit(t, s, id, nil)
		recs := readN(t, r, 1)
		return string(recs[0].Body)
	}
	t.Run("Latest", func(t *testing.T) {
		s, _ := New(cl.c, "starts", WithStart(Latest()))
		r := openSplit(t, s, "broker-a/0", nil)
		cl.produce("starts", 0, &client.Message{Body: []byte("new")})
		if got := readN(t, r, 1); string(got[0].Body) != "new" {
			t.Fatalf("Latest read %q", got[0].Body)
		}
	})
	t.Run("Timestamp", func(t *testing.T) {
		testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error { // store timestamps are in ms
			if time.Now().UnixMilli() <= time.Now().Add(-2*time.Millisecond).UnixMilli() {
				return errors.New("clock")
			}
			return nil
		})
		mid := time.Now().Add(2 * time.Millisecond)
		testutil.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
			if time.Now().Before(mid.Add(2 * time.Millisecond)) {
				return errors.New("not yet")
			}
			return nil
		})
		cl.produce("starts", 1, &client.Message{Body: []byte("after-mid")})
		s, _ := New(cl.c, "starts", WithStart(AtTimestamp(mid)))
		if got := first(t, s, "broker-a/1"); got != "after-mid" {
			t.Fatalf("AtTimestamp read %q", got)
		}
	})
	t.Run("GroupOffset", func(t *testing.T) {
		s, _ := New(cl.c, "starts", WithGroup("g_start"), WithStart(GroupOffset(Earliest())))
		if got := first(t, s, "broker-a/0"); got != "a0" {
			t.Fatalf("GroupOffset fallback read %q", got)
		}
		if err := cl.c.CommitOffset(ctx, "g_start", cl.queue("starts", 0), 7); err != nil {
			t.Fatal(err)
		}
		if got := first(t, s, "broker-a/0"); got != "a7" {
			t.Fatalf("GroupOffset read %q", got)
		}
	})
	t.Run("Offsets", func(t *testing.T) {
		s, _ := New(cl.c, "starts", WithStart(Offsets(map[string]int64{"broker-a/1": 15}, Earliest())))
		if got := first(t, s, "broker-a/1"); got != "b15" {
			t.Fatalf("Offsets read %q", got)
		}
		if got := first(t, s, "broker-a/0"); got != "a0" {
			t.Fatalf("Offsets fallback read %q", got)
		}
	})
}

// TestSourceStops covers StopAtOffsets (listed and unlisted splits) and
// StopAtTimestamp (in-stream and idle).
func TestSourceStops(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("stops", 2)
	cl.produce("stops", 0, bodies("a", 30)...)
	s, err := New(cl.c, "stops", WithStop(StopAtOffsets(map[string]int64{"broker-a/0": 10})))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, openSplit(t, s, "broker-a/0", nil), 10); string(got[9].Body) != "a9" {
		t.Fatalf("last record %q", got[9].Body)
	}
	readAll(t, openSplit(t, s, "broker-a/1", nil), 0) // unlisted: ends at once

	cut := time.Now().Add(-time.Hour) // every stored message is newer: nothing read
	s2, _ := New(cl.c, "stops", WithStop(StopAtTimestamp(cut, 0)))
	readAll(t, openSplit(t, s2, "broker-a/0", nil), 0)
	s3, _ := New(cl.c, "stops", WithStop(StopAtTimestamp(time.Now().Add(50*time.Millisecond), 0)))
	readAll(t, openSplit(t, s3, "broker-a/0", nil), 30) // all older; then idle past the stop time
}

// TestSourceTagFilter reads only matching tags; the offset passes the
// skipped messages.
func TestSourceTagFilter(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("tags", 1)
	msgs := bodies("m", 40)
	for i, m := range msgs {
		m.Tags = []string{"red", "green", "blue", "red"}[i%4]
	}
	cl.produce("tags", 0, msgs...)
	s, _ := New(cl.c, "tags", WithTagFilter("red || blue"), WithStop(StopAtLatest()))
	r := openSplit(t, s, "broker-a/0", nil)
	got := readAll(t, r, -1)
	if len(got) != 30 {
		t.Fatalf("read %d messages, want 30", len(got))
	}
	for _, m := range got {
		if m.Tags() == "green" {
			t.Fatalf("filtered tag read: %q", m.Body)
		}
	}
	if o, _ := DecodeOffset(r.Offset()); o.Next != 40 {
		t.Fatalf("offset %d, want 40", o.Next)
	}
}

// TestSourceFlowControl: the fetcher stops pulling at the buffer limit.
func TestSourceFlowControl(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("flow", 1)
	cl.produce("flow", 0, bodies("m", 500)...)
	s, _ := New(cl.c, "flow", WithFlowControl(50, 1<<30), WithPullBatchSize(16))
	sr := openSplit(t, s, "broker-a/0", nil)
	r := sr.(*reader)
	buffered := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.mu.msgs
	}
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := buffered(); n < 50 {
			return fmt.Errorf("%d buffered", n)
		}
		return nil
	})
	// Give the fetcher time to (wrongly) go on; it must stay within one batch.
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := buffered(); n > 50+16 {
			t.Fatalf("%d messages buffered, limit 50 (+ one batch of 16)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := readN(t, sr, 500)
	if string(got[499].Body) != "m499" {
		t.Fatalf("last %q", got[499].Body)
	}
	// Bytes limit: 1 byte lets one batch in at a time.
	s2, _ := New(cl.c, "flow", WithFlowControl(1000, 1), WithStop(StopAtLatest()))
	readAll(t, openSplit(t, s2, "broker-a/0", nil), 500)
}

// TestSourcePollHonoursContext: an idle Poll returns promptly on ctx
// cancellation without losing the records that arrive later.
func TestSourcePollHonoursContext(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("idle", 1)
	s, _ := New(cl.c, "idle", WithPollTimeout(5*time.Second))
	r := openSplit(t, s, "broker-a/0", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	start := time.Now()
	recs, err := r.Poll(ctx, 10)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || len(recs) != 0 {
		t.Fatalf("idle poll: %d records, %v", len(recs), err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancelled poll took %v", d)
	}
	cl.produce("idle", 0, bodies("m", 5)...)
	if got := readN(t, r, 5); string(got[0].Body) != "m0" {
		t.Fatalf("first %q", got[0].Body)
	}
	closeStart := time.Now()
	if err := r.Close(); err != nil { // cancels the parked long poll
		t.Fatal(err)
	}
	if d := time.Since(closeStart); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if _, err := r.Poll(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("poll after close: %v", err)
	}
}

// TestSourceReportsCheckpointedOffset: NotifyCheckpointComplete commits the
// offset noted at the barrier, not the reader's later position.
func TestSourceReportsCheckpointedOffset(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("report", 1)
	cl.produce("report", 0, bodies("m", 20)...)
	s, _ := New(cl.c, "report", WithGroup("g_report"))
	r := openSplit(t, s, "broker-a/0", nil)
	readN(t, r, 8)
	ctx := context.Background()
	if err := r.NotifyCheckpointComplete(ctx, 1); err != nil { // nothing noted yet
		t.Fatal(err)
	}
	if _, err := cl.c.QueryConsumerOffset(ctx, "g_report", cl.queue("report", 0)); !errors.Is(err, client.ErrNoOffset) {
		t.Fatalf("offset reported before any checkpoint: %v", err)
	}
	o, _ := DecodeOffset(r.Offset()) // barrier
	readN(t, r, 4)                   // read on while the checkpoint commits
	if err := r.NotifyCheckpointComplete(ctx, 2); err != nil {
		t.Fatal(err)
	}
	got, err := cl.c.QueryConsumerOffset(ctx, "g_report", cl.queue("report", 0))
	if err != nil || got != o.Next {
		t.Fatalf("reported %d (%v), want %d", got, err, o.Next)
	}
	s2, _ := New(cl.c, "report", WithGroup("g_report2"), WithOffsetReporting(false))
	r2 := openSplit(t, s2, "broker-a/0", nil)
	readN(t, r2, 3)
	r2.Offset()
	if err := r2.NotifyCheckpointComplete(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.QueryConsumerOffset(ctx, "g_report2", cl.queue("report", 0)); !errors.Is(err, client.ErrNoOffset) {
		t.Fatalf("offset reported with reporting off: %v", err)
	}
}

// TestSourceOffsetMovedResets: a restored offset past the queue's end
// (OFFSET_MOVED) resets the split to the earliest available offset.
func TestSourceOffsetMovedResets(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("moved", 1)
	cl.produce("moved", 0, bodies("m", 10)...)
	s, _ := New(cl.c, "moved")
	r := openSplit(t, s, "broker-a/0", Offset{Next: 1000, End: -1}.AppendTo(nil))
	got := readN(t, r, 10)
	if string(got[0].Body) != "m0" || string(got[9].Body) != "m9" {
		t.Fatalf("after reset read %q … %q", got[0].Body, got[9].Body)
	}
}

// TestSourceDiscovery: queues added to the topic are found by
// DiscoverSplits and start at their min offset even with a Latest start.
func TestSourceDiscovery(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("grow", 1)
	s, _ := New(cl.c, "grow", WithStart(Latest()))
	ctx := context.Background()
	if sp, err := s.Splits(ctx); err != nil || len(sp) != 1 {
		t.Fatalf("splits %v %v", sp, err)
	}
	cl.createTopic("grow", 3)
	cl.produce("grow", 2, bodies("n", 3)...)
	sp, err := s.DiscoverSplits(ctx)
	if err != nil || len(sp) != 3 {
		t.Fatalf("discovered %v %v", sp, err)
	}
	if got := readN(t, openSplit(t, s, "broker-a/2", nil), 3); string(got[0].Body) != "n0" {
		t.Fatalf("new queue read %q first", got[0].Body)
	}
}

// TestSourceBytes reads bodies through the []byte adapter.
func TestSourceBytes(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("bytes", 1)
	cl.produce("bytes", 0, bodies("b", 5)...)
	s, _ := New(cl.c, "bytes", WithStop(StopAtLatest()))
	r, err := s.Bytes().Open(context.Background(), source.Split{ID: "broker-a/0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []string
	for {
		recs, err := r.Poll(context.Background(), 2)
		for _, rec := range recs {
			got = append(got, string(rec.Value))
		}
		if errors.Is(err, source.ErrEndOfSplit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, []string{"b0", "b1", "b2", "b3", "b4"}) {
		t.Fatalf("got %v", got)
	}
}

func TestSourceOptionsValidated(t *testing.T) {
	cl := newCluster(t)
	for name, opts := range map[string][]Option{
		"flow":    {WithFlowControl(0, 1)},
		"bytes":   {WithFlowControl(1, 0)},
		"batch":   {WithPullBatchSize(0)},
		"poll":    {WithPollTimeout(time.Hour)},
		"group":   {WithGroup("")},
		"start":   {WithStart(Offsets(map[string]int64{"x/0": -1}, Earliest()))},
		"stop":    {WithStop(StopAtOffsets(map[string]int64{"x/0": -5}))},
		"retries": {WithPullRetries(-1)},
	} {
		if _, err := New(cl.c, "t", opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(nil, "t"); !errors.Is(err, ErrInvalidOption) {
		t.Error(err)
	}
	if _, err := New(cl.c, ""); !errors.Is(err, ErrInvalidOption) {
		t.Error(err)
	}
}

// FuzzDecodeOffset: DecodeOffset never panics, and what it accepts
// re-encodes to the same bytes.
func FuzzDecodeOffset(f *testing.F) {
	f.Add(Offset{Next: 5, End: -1}.AppendTo(nil))
	f.Add(Offset{Next: 0, End: 100}.AppendTo(nil))
	f.Add([]byte{1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := DecodeOffset(b)
		if err != nil {
			if !errors.Is(err, source.ErrBadOffset) {
				t.Fatalf("error %v does not wrap ErrBadOffset", err)
			}
			return
		}
		if got := o.AppendTo(nil); string(got) != string(b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}
