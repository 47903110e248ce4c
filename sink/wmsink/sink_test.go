package wmsink_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink/wmsink"
	"github.com/runnel-dev/runnel/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counting is a real Publisher that counts what passes through it.
type counting struct {
	message.Publisher
	calls, msgs atomic.Int64
}

func (c *counting) Publish(topic string, msgs ...*message.Message) error {
	c.calls.Add(1)
	c.msgs.Add(int64(len(msgs)))
	return c.Publisher.Publish(topic, msgs...)
}

// receive reads n messages of topic from a persistent GoChannel and returns
// their UUIDs sorted.
func receive(t *testing.T, gc *gochannel.GoChannel, topic string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := gc.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	timeout := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case m := <-ch:
			got = append(got, m.UUID)
			m.Ack()
		case <-timeout:
			t.Fatalf("received %d of %d messages on %s", len(got), n, topic)
		}
	}
	sort.Strings(got)
	return got
}

func TestBatchesAndFlush(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer gc.Close()
	pub := &counting{Publisher: gc}
	s := wmsink.New(pub, "out", wmsink.WithBatchSize(3))
	ctx := context.Background()
	write := func(id string) {
		t.Helper()
		if err := s.Write(ctx, message.NewMessage(id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	write("a")
	write("b")
	if pub.msgs.Load() != 0 || s.Buffered() != 2 {
		t.Fatalf("published %d, buffered %d before the batch filled", pub.msgs.Load(), s.Buffered())
	}
	write("c")
	if pub.msgs.Load() != 3 || pub.calls.Load() != 1 || s.Buffered() != 0 {
		t.Fatalf("full batch: published %d in %d calls, buffered %d", pub.msgs.Load(), pub.calls.Load(), s.Buffered())
	}
	write("d")
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if pub.msgs.Load() != 4 || s.Buffered() != 0 {
		t.Fatalf("after flush: published %d, buffered %d", pub.msgs.Load(), s.Buffered())
	}
	if err := s.Flush(ctx); err != nil || pub.calls.Load() != 2 {
		t.Fatalf("empty flush: %v, %d calls", err, pub.calls.Load())
	}
	if got := fmt.Sprint(receive(t, gc, "out", 4)); got != "[a b c d]" {
		t.Fatalf("received %s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, message.NewMessage("e", nil)); !errors.Is(err, wmsink.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

// TestPublishErrorFailsFlush: a failing Publish fails Flush and keeps the
// messages for the next one.
func TestPublishErrorFailsFlush(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{}, nil)
	if err := gc.Close(); err != nil {
		t.Fatal(err)
	}
	s := wmsink.New(gc, "out", wmsink.WithClosePublisher())
	ctx := context.Background()
	for i := range 3 {
		if err := s.Write(ctx, message.NewMessage(strconv.Itoa(i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err == nil {
		t.Fatal("flush to a closed publisher succeeded")
	}
	if s.Buffered() != 3 {
		t.Fatalf("buffered %d after a failed flush, want 3", s.Buffered())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Flush(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("flush with a cancelled ctx: %v", err)
	}
	if err := s.Close(); err != nil { // GoChannel's Close is idempotent
		t.Fatal(err)
	}
}

func TestTopicFuncAndEncoded(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer gc.Close()
	pub := &counting{Publisher: gc}
	s := wmsink.NewEncoded(pub, "even", func(n int) (*message.Message, error) {
		if n < 0 {
			return nil, errors.New("negative")
		}
		m := message.NewMessage("n"+strconv.Itoa(n), []byte(strconv.Itoa(n)))
		if n%2 == 1 {
			m.Metadata.Set("topic", "odd")
		}
		return m, nil
	}, wmsink.WithTopicFunc(func(m *message.Message) string { return m.Metadata.Get("topic") }))
	ctx := context.Background()
	for _, n := range []int{0, 2, 1, 3, 4} {
		if err := s.Write(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Write(ctx, -1); err == nil {
		t.Fatal("marshal error not reported")
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Runs of one topic go in one Publish: even(0,2) odd(1,3) even(4).
	if pub.calls.Load() != 3 {
		t.Fatalf("%d publish calls, want 3", pub.calls.Load())
	}
	if got := fmt.Sprint(receive(t, gc, "even", 3)); got != "[n0 n2 n4]" {
		t.Fatalf("even: %s", got)
	}
	if got := fmt.Sprint(receive(t, gc, "odd", 2)); got != "[n1 n3]" {
		t.Fatalf("odd: %s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestInJob: a bounded job publishes every record through the sink.
func TestInJob(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer gc.Close()
	const n = 500
	vals := make([]int, n)
	for i := range vals {
		vals[i] = i
	}
	job := pipeline.New("wmsink", pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(5*time.Millisecond))
	nums := pipeline.FromSource(job, "nums", source.NewSlice(vals, 3))
	pipeline.To(nums, "out", wmsink.NewEncoded(gc, "out", func(n int) (*message.Message, error) {
		return message.NewMessage(fmt.Sprintf("%04d", n), nil), nil
	}, wmsink.WithBatchSize(16)))
	if err := job.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := receive(t, gc, "out", n)
	for i, u := range got {
		if u != fmt.Sprintf("%04d", i) {
			t.Fatalf("message %d is %s", i, u)
		}
	}
}

func BenchmarkWriteFlush(b *testing.B) {
	gc := gochannel.NewGoChannel(gochannel.Config{}, nil) // no subscribers: measures the sink
	defer gc.Close()
	s := wmsink.New(gc, "out", wmsink.WithBatchSize(64))
	ctx := context.Background()
	msg := message.NewMessage("u", []byte("payload"))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := s.Write(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 {
			if err := s.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := s.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}
