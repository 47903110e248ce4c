package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type cluster struct {
	t testing.TB
	b *broker.Broker
	c *client.Client
	p *client.Producer
}

func newCluster(t testing.TB, bopts ...broker.Option) *cluster {
	t.Helper()
	tc := testutil.RunCluster(t, bopts...)
	c := tc.NewClient(t)
	return &cluster{t: t, b: tc.Broker, c: c, p: testutil.NewProducer(t, c, "sink_test_producer")}
}

func (cl *cluster) createTopic(topic string, n int) {
	cl.t.Helper()
	testutil.CreateTopic(cl.t, cl.c, cl.b.Addr(), topic, n)
}

// readTopic returns every message stored in topic (all queues, up to the
// max offsets now), cloned.
func (cl *cluster) readTopic(topic string) []protocol.MessageExt {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := cl.c.RefreshRoute(ctx, topic)
	if err != nil {
		cl.t.Fatal(err)
	}
	var out []protocol.MessageExt
	for _, q := range r.SubscribeQueues() {
		end, err := cl.c.MaxOffset(ctx, q)
		if err != nil {
			cl.t.Fatal(err)
		}
		for off := int64(0); off < end; {
			res, err := cl.c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, Group: "reader", MaxMsgs: 32})
			if err != nil {
				cl.t.Fatal(err)
			}
			for i := range res.Messages {
				out = append(out, res.Messages[i].Clone())
			}
			off = res.NextBeginOffset
		}
	}
	return out
}

// TestSinkWritesEverything: every record written before Flush is stored
// once Flush returns.
func TestSinkWritesEverything(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("out", 4)
	s, err := New(cl.p, func(i int) (*client.Message, error) {
		return &client.Message{Topic: "out", Body: []byte(strconv.Itoa(i)), Keys: []string{"k" + strconv.Itoa(i)}}, nil
	}, WithMaxInFlight(64))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 3000
	for i := range n {
		if err := s.Write(ctx, i); err != nil {
			t.Fatal(err)
		}
		if len(s.sem) > 64 {
			t.Fatalf("%d sends in flight, limit 64", len(s.sem))
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if p := s.Pending(); p != 0 {
		t.Fatalf("%d pending after Flush", p)
	}
	var got []int
	for _, m := range cl.readTopic("out") {
		v, _ := strconv.Atoi(string(m.Body))
		got = append(got, v)
	}
	slices.Sort(got)
	if len(got) != n || got[0] != 0 || got[n-1] != n-1 || len(slices.Compact(got)) != n {
		t.Fatalf("stored %d messages, want %d distinct", len(got), n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

// TestSinkNeverDropsFailedSends: a send that fails (no such topic) makes
// Flush fail and is kept; once the topic exists, the next Flush stores it.
func TestSinkNeverDropsFailedSends(t *testing.T) {
	cl := newCluster(t, broker.WithAutoCreateTopics(false))
	s, err := New(cl.p, func(v string) (*client.Message, error) {
		return &client.Message{Topic: "later", Body: []byte(v)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Write(ctx, "precious"); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err == nil {
		t.Fatal("Flush succeeded although the topic does not exist")
	}
	if p := s.Pending(); p != 1 {
		t.Fatalf("pending %d after a failed flush, want 1", p)
	}
	cl.createTopic("later", 1)
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := cl.readTopic("later")
	if len(got) != 1 || string(got[0].Body) != "precious" {
		t.Fatalf("topic holds %d messages", len(got))
	}
}

func TestSinkOptionsValidated(t *testing.T) {
	cl := newCluster(t)
	m := func(int) (*client.Message, error) { return nil, nil }
	for name, err := range map[string]error{
		"producer": second(New[int](nil, m)),
		"mapper":   second(New[int](cl.p, nil)),
		"inflight": second(New(cl.p, m, WithMaxInFlight(0))),
		"timeout":  second(New(cl.p, m, WithSendTimeout(0))),
	} {
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
	s, _ := New(cl.p, m)
	if err := s.Write(context.Background(), 1); err == nil {
		t.Fatal("nil message accepted")
	}
	bad, _ := New(cl.p, func(int) (*client.Message, error) { return nil, errors.New("boom") })
	if err := bad.Write(context.Background(), 1); err == nil {
		t.Fatal("mapper error ignored")
	}
}

func second[T any](_ T, err error) error { return err }

type event struct {
	ID   int    `json:"id" validate:"gte=0"`
	Name string `json:"name" validate:"required"`
}

// TestDeadLetterSinkInJob runs a job reading JSON events from a topic
// with a dead-letter policy: undecodable and invalid records land in the
// DLQ topic with their reason, split and offset; the good ones reach the
// output; the job goes on.
func TestDeadLetterSinkInJob(t *testing.T) {
	cl := newCluster(t)
	cl.createTopic("events", 2)
	cl.createTopic("events_dlq", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	inputs := []string{`{"id":1,"name":"a"}`, `not json`, `{"id":2,"name":""}`, `{"id":3,"name":"c"}`, `{"id":-4,"name":"d"}`}
	for i, in := range inputs {
		q := protocol.MessageQueue{Topic: "events", BrokerName: "broker-a", QueueID: int32(i % 2)}
		if _, err := cl.p.Send(ctx, &client.Message{Topic: "events", Body: []byte(in), Queue: &q}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := srcmq.New(cl.c, "events", srcmq.WithStop(srcmq.StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := NewDeadLetter(cl.p, "events_dlq")
	if err != nil {
		t.Fatal(err)
	}
	job := pipeline.New("dlq-test", pipeline.CheckpointDir(t.TempDir()))
	evs := pipeline.FromBytes(job, "events", src.Bytes(), pipeline.JSON[event](),
		pipeline.OnBadRecord(pipeline.DeadLetter("dlq", dlq)))
	var good []int
	pipeline.To(evs, "out", sink.NewFunc(func(_ context.Context, e event) error { good = append(good, e.ID); return nil }, nil))
	if err := job.Run(ctx); err != nil {
		t.Fatal(err)
	}
	slices.Sort(good)
	if !slices.Equal(good, []int{1, 3}) {
		t.Fatalf("good records %v", good)
	}
	got := cl.readTopic("events_dlq")
	if len(got) != 3 {
		t.Fatalf("%d dead letters, want 3", len(got))
	}
	bodies := map[string]protocol.MessageExt{}
	for _, m := range got {
		bodies[string(m.Body)] = m
	}
	for i, in := range inputs {
		if i == 0 || i == 3 {
			continue
		}
		m, ok := bodies[in]
		if !ok {
			t.Fatalf("no dead letter for %q", in)
		}
		props := protocol.ParseProperties(m.Properties)
		wantSplit := fmt.Sprintf("broker-a/%d", i%2)
		if props[PropReason] == "" || props[PropSource] != "events" || props[PropSplit] != wantSplit ||
			props[PropQueueOffset] != strconv.Itoa(i/2) || props[PropBody] != "raw" || props[PropOffset] == "" ||
			m.Tags() != "runnel-dlq" || props[PropTime] == "" {
			t.Fatalf("dead letter of %q: properties %v", in, props)
		}
	}
}

func TestDeadLetterMessage(t *testing.T) {
	m := DeadLetterMessage("dlq", sink.DeadLetter{Reason: "bad\x01thing", Value: "v"})
	if string(m.Body) != "v" || m.Properties[PropBody] != "value" || m.Properties[PropReason] != "bad thing" {
		t.Fatalf("%+v", m)
	}
	if _, ok := m.Properties[PropSplit]; ok {
		t.Fatal("empty split set")
	}
	m = DeadLetterMessage("dlq", sink.DeadLetter{Offset: []byte{7}})
	if string(m.Body) != "-" || m.Properties[PropOffset] != "07" || m.Properties[PropQueueOffset] != "" {
		t.Fatalf("%+v", m)
	}
	if err := client.ValidateMessage(m, 1<<20); err != nil {
		t.Fatal(err)
	}
}
