package wmhandler_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/wmhandler"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// collector is a sink that keeps what it is given.
type collector[T any] struct {
	mu  sync.Mutex
	got []T
}

func (c *collector[T]) sink() *sink.Func[T] {
	return sink.NewFunc(func(_ context.Context, v T) error {
		c.mu.Lock()
		c.got = append(c.got, v)
		c.mu.Unlock()
		return nil
	}, nil)
}

func (c *collector[T]) all() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]T(nil), c.got...)
}

func inputs(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage("in-"+strconv.Itoa(i), []byte("p"+strconv.Itoa(i)))
		middleware.SetCorrelationID("corr-"+strconv.Itoa(i), msgs[i])
	}
	return msgs
}

func run(t *testing.T, job *pipeline.Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestRetryRecovererCorrelationID runs a Router-style chain: CorrelationID
// outermost, Retry, Recoverer innermost. Every message fails twice before
// it succeeds (Retry absorbs it); one always panics (Recoverer turns each
// panic into an error, Retry gives up, the pipeline dead-letters it); every
// produced message carries its input's correlation id.
func TestRetryRecovererCorrelationID(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n = 20
	var mu sync.Mutex
	attempts := map[string]int{}
	h := func(msg *message.Message) ([]*message.Message, error) {
		mu.Lock()
		attempts[msg.UUID]++
		a := attempts[msg.UUID]
		mu.Unlock()
		if msg.UUID == "in-7" {
			panic("poisoned " + msg.UUID)
		}
		if a <= 2 {
			return nil, fmt.Errorf("transient failure %d", a)
		}
		// Two outputs per input; no correlation id set here.
		return []*message.Message{
			message.NewMessage(msg.UUID+"-a", []byte(strings.ToUpper(string(msg.Payload)))),
			message.NewMessage(msg.UUID+"-b", nil),
		}, nil
	}
	chain := wmhandler.Wrap(h, middleware.CorrelationID, middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware, middleware.Recoverer)

	var out collector[*message.Message]
	var dead collector[sink.DeadLetter]
	job := pipeline.New("chain", pipeline.CheckpointInterval(10*time.Millisecond))
	in := pipeline.FromSource(job, "in", source.NewSlice(inputs(n), 2))
	res := wmhandler.Handle(in, "handler", chain, pipeline.OnError(pipeline.DeadLetter("dlq", dead.sink())))
	pipeline.To(res, "out", out.sink())
	run(t, job)

	got := out.all()
	if len(got) != 2*(n-1) {
		t.Fatalf("%d outputs, want %d", len(got), 2*(n-1))
	}
	for _, m := range got {
		in := strings.TrimSuffix(strings.TrimSuffix(m.UUID, "-a"), "-b")
		want := "corr-" + strings.TrimPrefix(in, "in-")
		if c := middleware.MessageCorrelationID(m); c != want {
			t.Fatalf("%s: correlation id %q, want %q", m.UUID, c, want)
		}
		if strings.HasSuffix(m.UUID, "-a") && string(m.Payload) != "P"+strings.TrimPrefix(in, "in-") {
			t.Fatalf("%s: payload %q", m.UUID, m.Payload)
		}
	}
	mu.Lock()
	for id, a := range attempts {
		want := 3
		if id == "in-7" {
			want = 4 // first call and MaxRetries retries
		}
		if a != want {
			t.Errorf("%s: %d attempts, want %d", id, a, want)
		}
	}
	mu.Unlock()
	d := dead.all()
	if len(d) != 1 || d[0].Operator != "handler" || !strings.Contains(d[0].Reason, "poisoned in-7") {
		t.Fatalf("dead letters %+v", d)
	}
}

// TestTimeout: the Timeout middleware bounds a handler that waits on its
// message's context.
func TestTimeout(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "in-1" {
			<-msg.Context().Done() // a stuck call that honours the context
			return nil, msg.Context().Err()
		}
		return []*message.Message{msg}, nil
	}
	var out collector[*message.Message]
	var dead collector[sink.DeadLetter]
	job := pipeline.New("timeout")
	in := pipeline.FromSource(job, "in", source.NewSlice(inputs(3), 1))
	res := wmhandler.Handle(in, "handler", wmhandler.Wrap(h, middleware.Timeout(20*time.Millisecond)),
		pipeline.OnError(pipeline.DeadLetter("dlq", dead.sink())))
	pipeline.To(res, "out", out.sink())
	start := time.Now()
	run(t, job)
	if len(out.all()) != 2 {
		t.Fatalf("%d outputs, want 2", len(out.all()))
	}
	d := dead.all()
	if len(d) != 1 || !strings.Contains(d[0].Reason, context.DeadlineExceeded.Error()) {
		t.Fatalf("dead letters %+v", d)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("job took %v, less than the timeout", el)
	}
}

// TestHandlerSeesJobContext: without a Timeout, a stuck handler is released
// when the job fails elsewhere (its message context is the task's).
func TestHandlerSeesJobContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	boom := errors.New("boom")
	entered := make(chan struct{})
	var once sync.Once
	h := func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "in-1" {
			<-entered // fail once in-0 is stuck
			return nil, boom
		}
		once.Do(func() { close(entered) })
		<-msg.Context().Done()
		return nil, msg.Context().Err()
	}
	job := pipeline.New("stuck")
	// Two splits: in-0 on split 0 (stuck), in-1 on split 1 (fails the job).
	in := pipeline.FromSource(job, "in", source.NewSlice(inputs(2), 2))
	pipeline.To(wmhandler.Handle(in, "handler", h), "out", sink.NewFunc[*message.Message](func(context.Context, *message.Message) error { return nil }, nil))
	done := make(chan error, 1)
	go func() { done <- job.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("job did not end: the stuck handler's context was not the job's")
	}
}

// TestPoisonQueue: watermill's PoisonQueue middleware publishes failed
// messages with their reason and reports success; the job goes on.
func TestPoisonQueue(t *testing.T) {
	defer goleak.VerifyNone(t)
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer gc.Close()
	pq, err := middleware.PoisonQueue(gc, "poison")
	if err != nil {
		t.Fatal(err)
	}
	h := func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "in-2" || msg.UUID == "in-4" {
			return nil, errors.New("bad payload")
		}
		return []*message.Message{msg}, nil
	}
	var out collector[*message.Message]
	job := pipeline.New("poison")
	in := pipeline.FromSource(job, "in", source.NewSlice(inputs(6), 2))
	pipeline.To(wmhandler.Handle(in, "handler", wmhandler.Wrap(h, pq)), "out", out.sink())
	run(t, job)
	if len(out.all()) != 4 {
		t.Fatalf("%d outputs, want 4", len(out.all()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := gc.Subscribe(ctx, "poison")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for len(ids) < 2 {
		select {
		case m := <-ch:
			if r := m.Metadata.Get(middleware.ReasonForPoisonedKey); r != "bad payload" {
				t.Fatalf("reason %q", r)
			}
			ids = append(ids, m.UUID)
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("poison queue has %v", ids)
		}
	}
	sort.Strings(ids)
	if fmt.Sprint(ids) != "[in-2 in-4]" {
		t.Fatalf("poisoned %v", ids)
	}
}

// TestThrottle: the Throttle middleware paces the handler.
func TestThrottle(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := func(msg *message.Message) ([]*message.Message, error) { return []*message.Message{msg}, nil }
	var out collector[*message.Message]
	job := pipeline.New("throttle")
	in := pipeline.FromSource(job, "in", source.NewSlice(inputs(5), 1))
	pipeline.To(wmhandler.Handle(in, "handler", wmhandler.Wrap(h, middleware.NewThrottle(1, 10*time.Millisecond).Middleware)), "out", out.sink())
	start := time.Now()
	run(t, job)
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Fatalf("5 messages at 1 per 10ms took %v", el)
	}
	if len(out.all()) != 5 {
		t.Fatalf("%d outputs", len(out.all()))
	}
}

// TestInputUntouched: the handler gets a copy: acking it (InstantAck) or
// changing its metadata does not reach the upstream's message.
func TestInputUntouched(t *testing.T) {
	defer goleak.VerifyNone(t)
	msgs := inputs(3)
	h := func(msg *message.Message) ([]*message.Message, error) {
		msg.Metadata.Set("touched", "yes")
		return []*message.Message{msg}, nil
	}
	var out collector[*message.Message]
	job := pipeline.New("copy")
	in := pipeline.FromSource(job, "in", source.NewSlice(msgs, 1))
	pipeline.To(wmhandler.Handle(in, "handler", wmhandler.Wrap(h, middleware.InstantAck)), "out", out.sink())
	run(t, job)
	for _, m := range msgs {
		select {
		case <-m.Acked():
			t.Fatalf("%s: upstream message acked by the handler chain", m.UUID)
		default:
		}
		if m.Metadata.Get("touched") != "" {
			t.Fatalf("%s: upstream message changed", m.UUID)
		}
	}
	for _, m := range out.all() {
		if m.Metadata.Get("touched") != "yes" {
			t.Fatalf("%s: handler's change lost", m.UUID)
		}
	}
}

// TestMapTyped: records are converted to messages and back.
func TestMapTyped(t *testing.T) {
	defer goleak.VerifyNone(t)
	h := func(msg *message.Message) ([]*message.Message, error) {
		n, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(msg.UUID, []byte(strconv.Itoa(2*n)))}, nil
	}
	var out collector[int]
	job := pipeline.New("typed")
	in := pipeline.FromSource(job, "in", source.NewSlice([]int{1, 2, 3, 4}, 1))
	doubled := wmhandler.Map(in, "double",
		func(n int) (*message.Message, error) {
			return message.NewMessage(strconv.Itoa(n), []byte(strconv.Itoa(n))), nil
		},
		wmhandler.Wrap(h, middleware.Recoverer),
		func(m *message.Message) (int, error) { return strconv.Atoi(string(m.Payload)) })
	pipeline.To(doubled, "out", out.sink())
	run(t, job)
	got := out.all()
	sort.Ints(got)
	if fmt.Sprint(got) != "[2 4 6 8]" {
		t.Fatalf("got %v", got)
	}
}

// TestHandlerErrorFailsJob: by default (no policy) a handler error fails
// the job, where a Router would redeliver forever.
func TestHandlerErrorFailsJob(t *testing.T) {
	defer goleak.VerifyNone(t)
	boom := errors.New("boom")
	h := func(*message.Message) ([]*message.Message, error) { return nil, boom }
	job := pipeline.New("fail")
	in := pipeline.FromSource(job, "in", source.NewSlice(inputs(2), 1))
	pipeline.To(wmhandler.Handle(in, "handler", h), "out", sink.NewFunc[*message.Message](func(context.Context, *message.Message) error { return nil }, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := job.Run(ctx); !errors.Is(err, boom) {
		t.Fatalf("run: %v", err)
	}
}

func BenchmarkHandle(b *testing.B) {
	msgs := inputs(1)
	h := wmhandler.Wrap(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{msg}, nil
	}, middleware.CorrelationID, middleware.Recoverer)
	job := pipeline.New("bench")
	gen := source.NewGenerator(1, int64(b.N), func(int, uint64) *message.Message { return msgs[0] })
	in := pipeline.FromSource(job, "in", gen)
	pipeline.To(wmhandler.Handle(in, "handler", h), "out", sink.NewFunc[*message.Message](func(context.Context, *message.Message) error { return nil }, nil))
	b.ReportAllocs()
	b.ResetTimer()
	if err := job.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
}
