package rocketmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestSourceEveryModeReportsLag opens a queue of 31 messages in each of
// the source's modes — records as Messages, as bodies (Bytes, what
// pipeline.FromBytes reads), each with queue locks (a fenced reader) and
// without — and checks that every reader reports the queue's lag, before
// and after a checkpoint of the first 10 (the bytes reader reported none:
// the status page showed "–").
func TestSourceEveryModeReportsLag(t *testing.T) {
	cl := newCluster(t)
	const topic = "lagged"
	cl.createTopic(topic, 1)
	cl.produce(topic, 0, bodies("m", 31)...)
	for _, mode := range []string{"messages", "bytes", "messages+locks", "bytes+locks"} {
		t.Run(mode, func(t *testing.T) {
			opts := []Option{WithOffsetReporting(false), WithStart(Earliest()), WithGroup("lag_" + strings.ReplaceAll(mode, "+", "_"))}
			locks := strings.HasSuffix(mode, "+locks")
			if locks {
				opts = append(opts, WithQueueLocking(true))
			}
			s, err := New(lockClient(t, cl, "lag-"+mode), topic, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			split := source.Split{ID: cl.broker + "/0"}
			if locks {
				if _, err := s.Splits(ctx); err != nil { // takes the locks
					t.Fatal(err)
				}
			}
			var r interface {
				Poll(context.Context, int) (int, error)
				Offset() []byte
				NotifyCheckpointComplete(context.Context, uint64) error
				Close() error
			}
			var lr any
			if strings.HasPrefix(mode, "bytes") {
				br, err := s.Bytes().Open(ctx, split, nil)
				if err != nil {
					t.Fatal(err)
				}
				r, lr = pollCounter[[]byte]{br}, br
			} else {
				mr, err := s.Open(ctx, split, nil)
				if err != nil {
					t.Fatal(err)
				}
				r, lr = pollCounter[Message]{mr}, mr
			}
			defer r.Close()
			rep, ok := lr.(source.LagReporter)
			if !ok {
				t.Fatalf("the %s reader (%T) does not report lag", mode, lr)
			}
			read := 0
			for read < 10 {
				pctx, pcancel := context.WithTimeout(ctx, time.Second)
				n, err := r.Poll(pctx, 10-read)
				pcancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatal(err)
				}
				read += n
			}
			if n, ok := rep.Lag(); !ok || n != 31 {
				t.Errorf("lag before any checkpoint: %d, %v; want 31 (nothing checkpointed)", n, ok)
			}
			_ = r.Offset()
			if err := r.NotifyCheckpointComplete(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if n, ok := rep.Lag(); !ok || n != 21 {
				t.Errorf("lag after checkpointing 10: %d, %v; want 21", n, ok)
			}
		})
	}
}

// pollCounter polls a reader of any record type, counting records.
type pollCounter[T any] struct{ source.SplitReader[T] }

func (p pollCounter[T]) Poll(ctx context.Context, n int) (int, error) {
	recs, err := p.SplitReader.Poll(ctx, n)
	return len(recs), err
}

// TestSourceDescribesOffsets: the source describes its offsets as runnel
// checkpoint inspect does, for the status page.
func TestSourceDescribesOffsets(t *testing.T) {
	s, err := New(&client.Client{}, "t")
	if err != nil {
		t.Fatal(err)
	}
	d := s.Bytes().(interface{ DescribeOffset([]byte) string })
	for _, c := range []struct {
		o    Offset
		want string
	}{{Offset{Next: 405, End: -1}, "next 405"}, {Offset{Next: 405, End: 500}, "next 405 (stop at 500)"}} {
		b := c.o.AppendTo(nil)
		if got := s.DescribeOffset(b); got != c.want {
			t.Errorf("Source.DescribeOffset(%v) = %q, want %q", c.o, got, c.want)
		}
		if got := d.DescribeOffset(b); got != c.want {
			t.Errorf("bytes source: DescribeOffset(%v) = %q, want %q", c.o, got, c.want)
		}
	}
	if got := s.DescribeOffset([]byte{1, 2}); got != "" {
		t.Errorf("DescribeOffset(junk) = %q, want \"\"", got)
	}
}

// TestSourceMissingTopicError: a job on a topic the name server does not
// know fails at once (no start-up retry) with a message saying so and how
// to create it, instead of "CODE 17 TOPIC_NOT_EXIST"; errors.Is still
// finds protocol.ErrTopicNotExist.
func TestSourceMissingTopicError(t *testing.T) {
	cl := newCluster(t)
	s, err := New(cl.c, "nosuchtopic")
	if err != nil {
		t.Fatal(err)
	}
	job := pipeline.New("missing", pipeline.CheckpointDir(t.TempDir()))
	pipeline.To(pipeline.FromSource(job, "in", s), "out", sink.NewFunc(func(context.Context, Message) error { return nil }, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err = job.Run(ctx)
	if !errors.Is(err, protocol.ErrTopicNotExist) || !strings.Contains(err.Error(), `topic "nosuchtopic" does not exist`) ||
		!strings.Contains(err.Error(), "runnel topic create nosuchtopic") || strings.Contains(err.Error(), "CODE 17") {
		t.Fatalf("Run = %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a missing topic was retried for %v", took)
	}
}

// syncLog is a goroutine-safe log buffer.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestSourceJobWaitsForNameServer starts a job whose name server is not
// up yet: the job logs what it waits for and retries with backoff, and
// once a name server and broker start on that address it reads the
// topic. The control: with StartupTimeout(0) the same job fails at once,
// with source.ErrUnavailable and the "is the name server running?" hint.
func TestSourceJobWaitsForNameServer(t *testing.T) {
	addr := freeAddr(t)
	newJob := func(t *testing.T, startup time.Duration, logs *syncLog, n *atomic.Int64) *pipeline.Job {
		src, err := Dial("late-ns", []client.Option{client.WithNameServers(addr), client.WithDialTimeout(time.Second)},
			WithStart(Earliest()), WithPollTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		job := pipeline.New("waits", pipeline.CheckpointDir(t.TempDir()), pipeline.StartupTimeout(startup),
			pipeline.Logger(slog.New(slog.NewTextHandler(logs, nil))))
		pipeline.To(pipeline.FromBytes(job, "in", src.Bytes(), bytesCodec{}), "out",
			sink.NewFunc(func(context.Context, []byte) error { n.Add(1); return nil }, nil))
		return job
	}

	t.Run("control: no budget", func(t *testing.T) {
		var logs syncLog
		var n atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		err := newJob(t, 0, &logs, &n).Run(ctx)
		if !errors.Is(err, source.ErrUnavailable) || !errors.Is(err, client.ErrNoNameServer) || !strings.Contains(err.Error(), "is the name server") {
			t.Fatalf("Run = %v", err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("failed after %v without a budget", took)
		}
	})

	t.Run("waits", func(t *testing.T) {
		var logs syncLog
		var n atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- newJob(t, 45*time.Second, &logs, &n).Run(ctx) }()
		testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if c := strings.Count(logs.String(), "waiting for a source to become reachable"); c < 2 {
				return fmt.Errorf("%d retries logged:\n%s", c, logs.String())
			}
			return nil
		})
		if !strings.Contains(logs.String(), "source=in") || !strings.Contains(logs.String(), "startup_budget_left=") {
			t.Errorf("the log does not say what it waits for:\n%s", logs.String())
		}
		cl := embedded.Run(t, embedded.WithNameServerAddr(addr), embedded.WithTopic("late-ns", 2))
		p, err := client.NewProducer(cl.Client(), "late_ns_producer")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for i := range 20 {
			if _, err := p.Send(ctx, &client.Message{Topic: "late-ns", Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			select {
			case err := <-errc:
				t.Fatalf("job ended: %v", err)
			default:
			}
			if got := n.Load(); got != 20 {
				return fmt.Errorf("%d of 20 records read", got)
			}
			return nil
		})
		cancel()
		if err := <-errc; err != nil {
			t.Fatalf("job: %v", err)
		}
	})
}

// bytesCodec passes bodies through.
type bytesCodec struct{}

func (bytesCodec) Append(dst []byte, v []byte) ([]byte, error) { return append(dst, v...), nil }
func (bytesCodec) Decode(b []byte) ([]byte, error)             { return append([]byte(nil), b...), nil }
func (bytesCodec) ID() string                                  { return "bytes" }
