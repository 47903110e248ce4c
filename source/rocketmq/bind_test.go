package rocketmq

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/transport/client"
)

// TestSourceGroupFromJob: a source without WithGroup reads, reports its
// checkpointed offsets and would lock under its job's name once a job runs
// it (under "runnel_" + topic before); WithGroup keeps the user's group;
// names RocketMQ refuses are mapped; Bytes binds the same source.
func TestSourceGroupFromJob(t *testing.T) {
	cl := newCluster(t)
	const topic = "grouped"
	cl.createTopic(topic, 1)
	cl.produce(topic, 0, bodies("m", 5)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	run := func(jobName string, src *Source) {
		t.Helper()
		job := pipeline.New(jobName, pipeline.CheckpointDir(t.TempDir()))
		pipeline.To(pipeline.FromSource(job, "in", src), "out", sink.NewFunc(func(context.Context, Message) error { return nil }, nil))
		if err := job.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	implicit, err := New(cl.c, topic, WithStop(StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	if g := implicit.Group(); g != "runnel_"+topic {
		t.Fatalf("unbound group %q", g)
	}
	run("orders-etl", implicit)
	if g := implicit.Group(); g != "orders-etl" {
		t.Fatalf("bound group %q, want the job's name", g)
	}
	// The final checkpoint's offset was reported under the job's group,
	// and nothing under the unbound default.
	if off, err := cl.c.QueryConsumerOffset(ctx, "orders-etl", cl.queue(topic, 0)); err != nil || off != 5 {
		t.Fatalf("offset under the job's group: %d, %v", off, err)
	}
	if _, err := cl.c.QueryConsumerOffset(ctx, "runnel_"+topic, cl.queue(topic, 0)); !errors.Is(err, client.ErrNoOffset) {
		t.Fatalf("offset under runnel_%s: %v", topic, err)
	}

	explicit, err := New(cl.c, topic, WithGroup("kept"), WithStop(StopAtLatest()))
	if err != nil {
		t.Fatal(err)
	}
	run("orders-etl-2", explicit)
	if g := explicit.Group(); g != "kept" {
		t.Fatalf("explicit group became %q", g)
	}
	if off, err := cl.c.QueryConsumerOffset(ctx, "kept", cl.queue(topic, 0)); err != nil || off != 5 {
		t.Fatalf("offset under the explicit group: %d, %v", off, err)
	}

	odd, err := New(cl.c, topic)
	if err != nil {
		t.Fatal(err)
	}
	b, ok := odd.Bytes().(jobinfo.Binder)
	if !ok {
		t.Fatal("Bytes() is not a jobinfo.Binder")
	}
	if err := b.Bind(jobinfo.Info{Job: "my job/v2:é", UID: "raw"}); err != nil {
		t.Fatal(err)
	}
	if g := odd.Group(); g != "my_job_v2___" || g != GroupName("my job/v2:é") {
		t.Fatalf("group of an odd job name: %q", g)
	}
	if long := GroupName(strings.Repeat("j", 300)); len(long) != client.MaxGroupLength {
		t.Fatalf("long job name: group of %d bytes", len(long))
	}
	// Bound again to the same job (another UID): fine; to another job: not.
	if err := odd.Bind(jobinfo.Info{Job: "my job/v2:é", UID: "again"}); err != nil {
		t.Fatalf("second Bind to the same job: %v", err)
	}
	if err := odd.Bind(jobinfo.Info{Job: "other"}); err == nil || !strings.Contains(err.Error(), "already bound") {
		t.Fatalf("Bind to another job: %v", err)
	}
}

// TestSourceDialInstanceName: a Dial source bound to a job and state
// directory names its client InstanceName(job, dir): a second source bound
// the same way (a restarted process) is granted the first one's queue
// locks at once, as the broker grants locks to the same client id, while a
// source bound to another directory, or whose client options name another
// instance, is refused them. Close closes a Dial source's client.
func TestSourceDialInstanceName(t *testing.T) {
	cl := newCluster(t)
	const topic = "dialled"
	cl.createTopic(topic, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "state")
	copts := []client.Option{client.WithNameServers(cl.ns), client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}
	dial := func(info jobinfo.Info, extra ...client.Option) *Source {
		t.Helper()
		s, err := Dial(topic, append(copts, extra...), WithQueueLocking(true), WithLockWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Bind(info); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	info := jobinfo.Info{Job: "locked", UID: "in", StateDir: dir}
	first := dial(info)
	if _, err := first.Splits(ctx); err != nil {
		t.Fatal(err)
	}
	if want := "@" + InstanceName("locked", dir); !strings.HasSuffix(first.c.ClientID(), want) {
		t.Fatalf("client id %q, want the instance name %q", first.c.ClientID(), want)
	}
	restarted := dial(info)
	if _, err := restarted.Splits(ctx); err != nil {
		t.Fatalf("a source of the same job and directory: %v", err)
	}
	other := dial(jobinfo.Info{Job: "locked", UID: "in", StateDir: dir + "-2"})
	if _, err := other.Splits(ctx); !errors.Is(err, ErrQueueLocked) {
		t.Fatalf("a source of another directory: %v, want ErrQueueLocked", err)
	}
	named := dial(info, client.WithInstanceName("explicit"))
	if _, err := named.Splits(ctx); !errors.Is(err, ErrQueueLocked) {
		t.Fatalf("a source whose client options name another instance: %v, want ErrQueueLocked", err)
	}
	if !strings.HasSuffix(named.c.ClientID(), "@explicit") {
		t.Fatalf("explicit instance name overridden: %q", named.c.ClientID())
	}

	// Binding after the client was made is refused; after Close the source
	// makes no new client.
	if err := first.Bind(jobinfo.Info{Job: "late"}); err == nil {
		t.Fatal("Bind to another job after use succeeded")
	}
	late, err := Dial(topic, copts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.Splits(ctx); err != nil {
		t.Fatal(err)
	}
	if err := late.Bind(info); err == nil || !strings.Contains(err.Error(), "after its client was made") {
		t.Fatalf("Bind after use: %v", err)
	}
	if err := late.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := late.c.RefreshRoute(ctx, topic); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("the Dial source's client after Close: %v", err)
	}
	closed, err := Dial(topic, copts)
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	if _, err := closed.Splits(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Splits after Close: %v", err)
	}
}

// TestSourceTwoLockedTopicsOneGroup: a job reading two topics with queue
// locks and the default group (the job's name) takes the locks of both
// topics' queues in that one group and reads everything.
func TestSourceTwoLockedTopicsOneGroup(t *testing.T) {
	cl := newCluster(t)
	for _, topic := range []string{"left", "right"} {
		cl.createTopic(topic, 2)
		cl.produce(topic, 0, bodies(topic, 10)...)
		cl.produce(topic, 1, bodies(topic, 10)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job := pipeline.New("two-topics", pipeline.CheckpointDir(t.TempDir()))
	var streams []*pipeline.Stream[Message]
	for _, topic := range []string{"left", "right"} {
		src, err := New(cl.c, topic, WithQueueLocking(true), WithStop(StopAtLatest()), WithLockWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		streams = append(streams, pipeline.FromSource(job, topic, src))
	}
	var n atomic.Int64
	pipeline.To(pipeline.Union(streams[0], streams[1]), "out", sink.NewFunc(func(context.Context, Message) error { n.Add(1); return nil }, nil))
	if err := job.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 40 {
		t.Fatalf("read %d messages, want 40", got)
	}
}
