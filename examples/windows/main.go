// Command windows is runnel's event-time windows example: click events are
// counted per user in 1-minute tumbling windows and in 30-minute sessions;
// deliberately late clicks re-fire their window (within the allowed
// lateness of 1 minute) or go to a side output (after it).
//
// It runs on generated data (no broker needed): a bounded generator source,
// so the end of the input fires every pending window. Output lines:
//
//	minute  user-07 09:03:00-09:04:00 count=12 firing=0
//	session user-07 09:00:01-10:05:12 count=310 firing=1
//	late    minute user-03 /cart 09:01:12
//
// Usage: go run ./examples/windows [-clicks 2000] [-splits 1] [-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/examples/windows/clicks"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

func main() {
	n := flag.Int64("clicks", 2000, "clicks per split")
	splits := flag.Int("splits", 1, "source splits")
	dir := flag.String("dir", "", "checkpoint directory (default: temporary)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	src := source.NewGenerator(*splits, *n, clicks.Gen)
	if err := run(ctx, os.Stdout, src, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "windows:", err)
		os.Exit(1)
	}
}

// run runs the job over src and writes its results to w, sorted (the
// order of results across keys is not deterministic).
func run(ctx context.Context, w io.Writer, src source.Source[clicks.Click], dir string) error {
	opts := []pipeline.JobOption{pipeline.CheckpointInterval(time.Second), pipeline.DefaultParallelism(2)}
	if dir != "" {
		opts = append(opts, pipeline.CheckpointDir(dir))
	}
	job := pipeline.New("windows-example", opts...)
	out := clicks.Build(job, src, clicks.DefaultOptions())
	var lines lineSink
	pipeline.To(out.PerMinute, "print-minutes", lines.results("minute "))
	pipeline.To(out.Sessions, "print-sessions", lines.results("session"))
	pipeline.To(out.LateForMinute, "print-late-minute", lines.late("minute"))
	pipeline.To(out.LateForSession, "print-late-session", lines.late("session"))
	if err := job.Run(ctx); err != nil {
		return err
	}
	for _, l := range lines.sorted() {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	return nil
}

// lineSink collects formatted lines from several sink tasks.
type lineSink struct {
	mu struct {
		sync.Mutex
		lines []string
	}
}

func (s *lineSink) add(l string) {
	s.mu.Lock()
	s.mu.lines = append(s.mu.lines, l)
	s.mu.Unlock()
}

func (s *lineSink) sorted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.mu.lines)
	slices.Sort(out)
	return out
}

func (s *lineSink) results(kind string) sink.Sink[window.Result[string, int64]] {
	return sink.NewFunc(func(_ context.Context, r window.Result[string, int64]) error {
		s.add(fmt.Sprintf("%s %s %s-%s count=%d firing=%d", kind, r.Key,
			r.Start.UTC().Format(time.TimeOnly), r.End.UTC().Format(time.TimeOnly), r.Value, r.Firing))
		return nil
	}, nil)
}

func (s *lineSink) late(kind string) sink.Sink[clicks.Click] {
	return sink.NewFunc(func(_ context.Context, c clicks.Click) error {
		s.add(fmt.Sprintf("late    %s %s", kind, c))
		return nil
	}, nil)
}
