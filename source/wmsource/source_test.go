package wmsource_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/source/wmsource"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// blockingPubSub returns a GoChannel whose Publish returns only once every
// subscriber acked the message: a returned Publish is an observed ack.
func blockingPubSub(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, nil)
	t.Cleanup(func() { _ = gc.Close() })
	return gc
}

// publishAsync publishes msg and closes the returned channel when Publish
// returned (the subscriber acked it).
func publishAsync(t *testing.T, wg *sync.WaitGroup, pub message.Publisher, topic string, msg *message.Message) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		if err := pub.Publish(topic, msg); err != nil {
			t.Errorf("publish %s: %v", msg.UUID, err)
		}
	}()
	return done
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

// notClosedFor checks that ch stays open for d (a negative check: it can
// only miss a bug, never report a false one).
func notClosedFor(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s", what)
	case <-time.After(d):
	}
}

func pollN(t *testing.T, r source.SplitReader[*message.Message], n int) []*message.Message {
	t.Helper()
	var got []*message.Message
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(got) < n {
		recs, err := r.Poll(ctx, n-len(got))
		if err != nil {
			t.Fatalf("poll after %d of %d: %v", len(got), n, err)
		}
		for i, rec := range recs {
			if len(rec.Offset) != 9 {
				t.Fatalf("record offset %x", rec.Offset)
			}
			if string(rec.Raw) != string(rec.Value.Payload) {
				t.Fatalf("raw %q != payload %q", rec.Raw, rec.Value.Payload)
			}
			_ = i
			got = append(got, rec.Value)
		}
	}
	return got
}

func seqOf(t *testing.T, off []byte) uint64 {
	t.Helper()
	if len(off) != 9 || off[0] != 1 {
		t.Fatalf("offset %x", off)
	}
	return binary.BigEndian.Uint64(off[1:])
}

// TestAckAfterCheckpointComplete follows one split through the reader
// protocol: messages are acked only by NotifyCheckpointComplete, and only
// those returned before the latest Offset call; acks by downstream code on
// the records reach nothing. (A blocking GoChannel serialises the publishes
// of a topic: the next Publish starts only after the previous ack.)
func TestAckAfterCheckpointComplete(t *testing.T) {
	defer goleak.VerifyNone(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	gc := blockingPubSub(t)
	src := wmsource.New(gc, "in")
	splits, err := src.Splits(context.Background())
	if err != nil || len(splits) != 1 || splits[0].ID != "0" {
		t.Fatalf("splits %v, %v", splits, err)
	}
	r, err := src.Open(context.Background(), splits[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	m1 := message.NewMessage("u1", []byte("one"))
	m1.Metadata.Set("k", "v1")
	d1 := publishAsync(t, &wg, gc, "in", m1)
	got := pollN(t, r, 1)
	if got[0].UUID != "u1" || got[0].Metadata.Get("k") != "v1" || string(got[0].Payload) != "one" {
		t.Fatalf("got %v", got[0])
	}
	// Downstream acks its copy: the subscriber must not see it.
	got[0].Ack()
	notClosedFor(t, d1, 50*time.Millisecond, "message acked before any checkpoint")
	// A completion without an Offset call (no checkpoint covers u1) acks
	// nothing.
	if err := r.NotifyCheckpointComplete(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	notClosedFor(t, d1, 50*time.Millisecond, "message acked by a checkpoint that does not cover it")
	if s := seqOf(t, r.Offset()); s != 1 {
		t.Fatalf("offset seq %d, want 1", s)
	}
	if err := r.NotifyCheckpointComplete(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, d1, "ack of u1 after its checkpoint")

	// u2 is polled after the snapshot of checkpoint 3: 3 does not cover it.
	d2 := publishAsync(t, &wg, gc, "in", message.NewMessage("u2", []byte("two")))
	if s := seqOf(t, r.Offset()); s != 1 {
		t.Fatalf("offset seq %d, want 1", s)
	}
	if got := pollN(t, r, 1); got[0].UUID != "u2" {
		t.Fatalf("second message %s", got[0].UUID)
	}
	if err := r.NotifyCheckpointComplete(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	notClosedFor(t, d2, 50*time.Millisecond, "u2 acked by a checkpoint snapshotted before it was polled")
	if s := seqOf(t, r.Offset()); s != 2 {
		t.Fatalf("offset seq %d, want 2", s)
	}
	if err := r.NotifyCheckpointComplete(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, d2, "ack of u2")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestPollHonoursContext: a Poll with nothing to read returns the ctx error
// promptly and loses nothing.
func TestPollHonoursContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer gc.Close()
	r, err := wmsource.New(gc, "t").Open(context.Background(), source.Split{ID: "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	recs, err := r.Poll(ctx, 10)
	if !errors.Is(err, context.DeadlineExceeded) || len(recs) != 0 {
		t.Fatalf("poll: %d records, %v", len(recs), err)
	}
	if s := seqOf(t, r.Offset()); s != 0 {
		t.Fatalf("seq %d", s)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRestoredOffset: a restored offset continues the sequence; a foreign
// one is refused.
func TestRestoredOffset(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer gc.Close()
	if err := gc.Publish("t", message.NewMessage("a", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	src := wmsource.New(gc, "t")
	for _, bad := range [][]byte{{}, {1, 2, 3}, {2, 0, 0, 0, 0, 0, 0, 0, 1}, make([]byte, 10)} {
		if _, err := src.Open(context.Background(), source.Split{ID: "0"}, bad); !errors.Is(err, source.ErrBadOffset) {
			t.Fatalf("offset %x: %v", bad, err)
		}
	}
	r, err := src.Open(context.Background(), source.Split{ID: "0"}, []byte{1, 0, 0, 0, 0, 0, 0, 0, 41})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := r.Poll(ctx, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("poll %d, %v", len(recs), err)
	}
	if s := seqOf(t, recs[0].Offset); s != 42 {
		t.Fatalf("record seq %d, want 42", s)
	}
	if s := seqOf(t, r.Offset()); s != 42 {
		t.Fatalf("seq %d, want 42", s)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDecoded: a typed source decodes; a decode error fails Poll.
func TestDecoded(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer gc.Close()
	for _, p := range []string{"1", "x"} {
		if err := gc.Publish("t", message.NewMessage(p, []byte(p))); err != nil {
			t.Fatal(err)
		}
	}
	src := wmsource.NewDecoded(gc, "t", func(m *message.Message) (int, error) {
		var n int
		_, err := fmt.Sscan(string(m.Payload), &n)
		return n, err
	}, wmsource.WithEventTime(func(*message.Message) time.Time { return time.Unix(7, 0) }))
	r, err := src.Open(context.Background(), source.Split{ID: "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var vals []int
	for {
		recs, err := r.Poll(ctx, 1)
		if errors.Is(err, wmsource.ErrDecode) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if !rec.EventTime.Equal(time.Unix(7, 0)) {
				t.Fatalf("event time %v", rec.EventTime)
			}
			vals = append(vals, rec.Value)
		}
	}
	// GoChannel's persistent replay has no order: "1" may come after "x".
	if len(vals) > 1 || (len(vals) == 1 && vals[0] != 1) {
		t.Fatalf("values %v", vals)
	}
}

// TestSubscriberClosedUnderJob: Poll reports a subscription whose channel
// the subscriber closed.
func TestSubscriberClosedUnderJob(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{}, nil)
	r, err := wmsource.New(gc, "t").Open(context.Background(), source.Split{ID: "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := gc.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Poll(ctx, 1); !errors.Is(err, wmsource.ErrSubscriptionClosed) {
		t.Fatalf("poll: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// subscribed is a real Subscriber that reports its first Subscribe call, so
// that a test publishes to a non-persistent GoChannel only once the job
// listens.
type subscribed struct {
	message.Subscriber
	once sync.Once
	ch   chan struct{}
}

func (s *subscribed) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out, err := s.Subscriber.Subscribe(ctx, topic)
	s.once.Do(func() { close(s.ch) })
	return out, err
}

// TestJobAcksOnlyFlushedRecords runs a checkpointed job from a GoChannel
// whose Publish returns when the job acks: every message must have been
// flushed by the sink (the checkpoint's sink flush precedes its completion)
// before its ack, and every message must reach the KV sink.
func TestJobAcksOnlyFlushedRecords(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n = 40
	gc := blockingPubSub(t)
	sub := &subscribed{Subscriber: gc, ch: make(chan struct{})}
	dir := t.TempDir()

	var mu sync.Mutex
	written := map[string]bool{}
	flushed := map[string]bool{}
	probe := sink.NewFunc(func(_ context.Context, m *message.Message) error {
		mu.Lock()
		written[m.UUID] = true
		mu.Unlock()
		return nil
	}, func(context.Context) error {
		mu.Lock()
		for u := range written {
			flushed[u] = true
		}
		mu.Unlock()
		return nil
	})
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(m *message.Message) []byte { return []byte(m.UUID) },
		func(dst []byte, m *message.Message) ([]byte, error) { return append(dst, m.Payload...), nil })
	if err != nil {
		t.Fatal(err)
	}
	job := pipeline.New("wm-acks", pipeline.CheckpointDir(filepath.Join(dir, "cp")), pipeline.CheckpointInterval(2*time.Millisecond))
	msgs := pipeline.FromSource(job, "in", wmsource.New(sub, "in"))
	prefixed := pipeline.Map(msgs, "prefix", func(_ context.Context, m *message.Message) (*message.Message, error) {
		return message.NewMessage(m.UUID, append([]byte("P:"), m.Payload...)), nil
	})
	pipeline.To(prefixed, "probe", probe)
	pipeline.To(prefixed, "kv", kv)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- job.Run(ctx) }()
	waitClosed(t, sub.ch, "job subscribed")
	for i := range n {
		uuid := fmt.Sprintf("m%03d", i)
		// Returns when the job acked the message.
		if err := gc.Publish("in", message.NewMessage(uuid, []byte(uuid))); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		ok := flushed[uuid]
		mu.Unlock()
		if !ok {
			t.Fatalf("%s acked before the sink flushed it", uuid)
		}
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("run: %v", err)
	}
	// The job closed its sink: read the committed records back.
	kv, err = sink.NewKV(filepath.Join(dir, "kv"), func(*message.Message) []byte { return nil },
		func(dst []byte, _ *message.Message) ([]byte, error) { return dst, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	count := 0
	for k, v := range kv.All() {
		if k == nil {
			t.Fatal(string(v))
		}
		if string(v) != "P:"+string(k) {
			t.Fatalf("kv %s = %s", k, v)
		}
		count++
	}
	if count != n {
		t.Fatalf("kv has %d records, want %d", count, n)
	}
}

// BenchmarkPollAck measures a split reading GoChannel messages, with a
// checkpoint (Offset + NotifyCheckpointComplete) every 64 messages. The
// figure includes GoChannel's own delivery.
func BenchmarkPollAck(b *testing.B) {
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, nil)
	defer gc.Close()
	r, err := wmsource.New(gc, "t").Open(context.Background(), source.Split{ID: "0"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	n := b.N
	wg.Go(func() {
		for range n {
			if err := gc.Publish("t", message.NewMessage("u", []byte("payload"))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for got := 0; got < n; {
		recs, err := r.Poll(ctx, 64)
		if err != nil {
			b.Fatal(err)
		}
		got += len(recs)
		_ = r.Offset()
		if err := r.NotifyCheckpointComplete(ctx, uint64(got)); err != nil {
			b.Fatal(err)
		}
	}
}
