package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// bindLog records, in order, what the job did to the sources and sinks of
// the bind tests.
type bindLog struct {
	mu     sync.Mutex
	events []string
}

func (l *bindLog) add(format string, args ...any) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *bindLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// bindingSource is a source that implements jobinfo.Binder and logs Bind,
// Splits and Open.
type bindingSource[T any] struct {
	name string
	src  source.Source[T]
	log  *bindLog
	err  error // returned by Bind
}

func (s *bindingSource[T]) Bind(info jobinfo.Info) error {
	s.log.add("bind %s: %+v", s.name, info)
	return s.err
}

func (s *bindingSource[T]) Splits(ctx context.Context) ([]source.Split, error) {
	s.log.add("splits %s", s.name)
	return s.src.Splits(ctx)
}

func (s *bindingSource[T]) Open(ctx context.Context, sp source.Split, off []byte) (source.SplitReader[T], error) {
	s.log.add("open %s", s.name)
	return s.src.Open(ctx, sp, off)
}

// bindingSink is a two-phase-commit sink that implements jobinfo.Binder
// and logs Bind, Recover and the first Write.
type bindingSink[T any] struct {
	name  string
	log   *bindLog
	err   error
	wrote bool
}

func (s *bindingSink[T]) Bind(info jobinfo.Info) error {
	s.log.add("bind %s: %+v", s.name, info)
	return s.err
}

func (s *bindingSink[T]) Write(context.Context, T) error {
	if !s.wrote {
		s.wrote = true
		s.log.add("write %s", s.name)
	}
	return nil
}
func (s *bindingSink[T]) Flush(context.Context) error                       { return nil }
func (s *bindingSink[T]) Close() error                                      { return nil }
func (s *bindingSink[T]) PreCommit(context.Context, uint64) ([]byte, error) { return []byte("t"), nil }
func (s *bindingSink[T]) Commit(context.Context, []byte) error              { return nil }
func (s *bindingSink[T]) Abort(context.Context, []byte) error               { return nil }

func (s *bindingSink[T]) Recover(context.Context, [][]byte) error {
	s.log.add("recover %s", s.name)
	return nil
}

// TestPipelineBindsSourcesAndSinks: Run binds every source (FromSource,
// FromBytes, FromSourceDecoded) and sink (To, a DeadLetter policy shared by
// a source and an operator) that implements jobinfo.Binder exactly once,
// with the job's name, its operator's UID and the checkpoint directory,
// before any of them is listed, opened, recovered or written to; a source
// value added under two UIDs is bound once, with the first.
func TestPipelineBindsSourcesAndSinks(t *testing.T) {
	log := &bindLog{}
	dir := filepath.Join(t.TempDir(), "ckpt")
	job := pipeline.New("bind-job", pipeline.CheckpointDir(dir))
	ints := &bindingSource[int]{name: "ints", src: source.NewSlice([]int{1, 2, 3}, 2), log: log}
	raw := &bindingSource[[]byte]{name: "raw", src: source.NewSlice([][]byte{[]byte(`4`), []byte(`x`)}, 1), log: log}
	strs := &bindingSource[string]{name: "strs", src: source.NewSlice([]string{"5", "y"}, 1), log: log}
	out := &bindingSink[int]{name: "out", log: log}
	dlq := &bindingSink[sink.DeadLetter]{name: "dlq", log: log}
	bad := pipeline.DeadLetter("dlq", dlq)

	a := pipeline.FromSource(job, "a", ints)
	again := pipeline.FromSource(job, "a-again", ints)
	b := pipeline.FromBytes(job, "b", raw, pipeline.JSON[int](), pipeline.OnBadRecord(bad))
	c := pipeline.FromSourceDecoded(job, "c", strs, func(s string) (int, error) {
		var v int
		_, err := fmt.Sscan(s, &v)
		return v, err
	}, pipeline.OnBadRecord(bad))
	checked := pipeline.Map(pipeline.Union(a, again, b, c), "check", func(_ context.Context, v int) (int, error) {
		if v == 3 {
			return 0, errors.New("three")
		}
		return v, nil
	}, pipeline.OnError(bad))
	pipeline.To(checked, "out", out)
	runJob(t, job)

	events := log.all()
	want := map[string]string{
		"ints": fmt.Sprintf("%+v", jobinfo.Info{Job: "bind-job", UID: "a", StateDir: dir}),
		"raw":  fmt.Sprintf("%+v", jobinfo.Info{Job: "bind-job", UID: "b", StateDir: dir}),
		"strs": fmt.Sprintf("%+v", jobinfo.Info{Job: "bind-job", UID: "c", StateDir: dir}),
		"dlq":  fmt.Sprintf("%+v", jobinfo.Info{Job: "bind-job", UID: "dlq", StateDir: dir}),
		"out":  fmt.Sprintf("%+v", jobinfo.Info{Job: "bind-job", UID: "out", StateDir: dir}),
	}
	binds, lastBind := map[string]int{}, -1
	for i, e := range events {
		name, info, ok := strings.Cut(strings.TrimPrefix(e, "bind "), ": ")
		if !strings.HasPrefix(e, "bind ") || !ok {
			continue
		}
		binds[name]++
		lastBind = i
		if info != want[name] {
			t.Errorf("%s bound with %s, want %s", name, info, want[name])
		}
	}
	for name := range want {
		if binds[name] != 1 {
			t.Errorf("%s bound %d times, want once (events %q)", name, binds[name], events)
		}
	}
	first := slices.IndexFunc(events, func(e string) bool { return !strings.HasPrefix(e, "bind ") })
	if first < 0 || first < lastBind {
		t.Fatalf("a source or sink was used before every one was bound: %q", events)
	}
	for _, e := range []string{"splits ints", "open raw", "open strs", "recover out", "recover dlq", "write out", "write dlq"} {
		if !slices.Contains(events, e) {
			t.Errorf("no %q in %q", e, events)
		}
	}
}

// TestPipelineBindErrorFailsRun: a Bind error fails Run with it before any
// source is listed, any sink recovered or the checkpoint directory made;
// a job without CheckpointDir binds with an empty StateDir.
func TestPipelineBindErrorFailsRun(t *testing.T) {
	log := &bindLog{}
	dir := filepath.Join(t.TempDir(), "ckpt")
	job := pipeline.New("failing", pipeline.CheckpointDir(dir))
	refused := errors.New("refused")
	src := &bindingSource[int]{name: "in", src: source.NewSlice([]int{1}, 1), log: log}
	pipeline.To(pipeline.FromSource(job, "in", src), "out", &bindingSink[int]{name: "out", log: log, err: refused})
	err := job.Run(context.Background())
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), `"out"`) {
		t.Fatalf("Run = %v, want the Bind error of sink out", err)
	}
	if ev := log.all(); !slices.Equal(ev, []string{
		fmt.Sprintf("bind in: %+v", jobinfo.Info{Job: "failing", UID: "in", StateDir: dir}),
		fmt.Sprintf("bind out: %+v", jobinfo.Info{Job: "failing", UID: "out", StateDir: dir}),
	}) {
		t.Fatalf("events %q", ev)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("checkpoint directory after a failed Bind: %v", err)
	}

	log2 := &bindLog{}
	job2 := pipeline.New("no-dir")
	pipeline.To(pipeline.FromSource(job2, "in", &bindingSource[int]{name: "in", src: source.NewSlice([]int{1}, 1), log: log2}),
		"out", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	runJob(t, job2)
	if ev := log2.all(); len(ev) == 0 || ev[0] != fmt.Sprintf("bind in: %+v", jobinfo.Info{Job: "no-dir", UID: "in"}) {
		t.Fatalf("events %q", ev)
	}
}
