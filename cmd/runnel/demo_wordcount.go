package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

type demoFlags struct {
	lines    int
	queues   int
	interval time.Duration
	top      int
	seed     uint64
}

// newDemoWordcountCmd is `runnel demo wordcount`: the word-count job end to
// end on an embedded name server and broker.
func newDemoWordcountCmd() *cobra.Command {
	f := demoFlags{}
	cmd := &cobra.Command{
		Use:   "wordcount",
		Short: "Run the word-count demo job end to end on an embedded broker",
		Long: `Starts an embedded RocketMQ name server and broker on free loopback ports with a
temporary data directory, produces sample text (with a progress bar), runs the
word-count job over it (RocketMQ source bounded at the offsets the topic had
when the job started, keyed counts in checkpointed state), prints every
completed checkpoint and the top words, removes the data and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), f, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.lines, "lines", 50_000, "lines of sample text to produce")
	fl.IntVar(&f.queues, "queues", 4, "queues of the input topic (one source split each)")
	fl.DurationVar(&f.interval, "interval", 100*time.Millisecond, "checkpoint interval")
	fl.IntVar(&f.top, "top", 10, "number of top words to print")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the sample text")
	return cmd
}

func runDemo(ctx context.Context, f demoFlags, out io.Writer) (err error) {
	if f.lines < 1 || f.queues < 1 || f.interval <= 0 || f.top < 0 {
		return errors.New("demo: --lines and --queues must be at least 1, --interval positive, --top not negative")
	}
	env, err := startDemoEnv(ctx, out)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.Close()) }()
	dir, cl, c := env.dir, env.cl, env.c

	const topic = "demo-lines"
	if err := cl.CreateTopic(ctx, topic, f.queues); err != nil {
		return err
	}
	lines := wordcount.SampleLines(f.lines, f.seed)
	fmt.Fprintf(out, "producing %d lines of sample text to topic %s (%d queues)\n", f.lines, topic, f.queues)
	if err := produceWithBar(ctx, c, topic, lines, out); err != nil {
		return err
	}

	src, err := rocketmq.New(c, topic, rocketmq.WithStop(rocketmq.StopAtLatest()))
	if err != nil {
		return err
	}
	var (
		mu     sync.Mutex
		counts []wordcount.WordCount
	)
	collect := sink.NewFunc(func(_ context.Context, wc wordcount.WordCount) error {
		mu.Lock()
		counts = append(counts, wc)
		mu.Unlock()
		return nil
	}, nil)
	w := &checkpointWatcher{out: out, addr: make(chan string, 1), printed: make(map[uint64]bool)}
	job := pipeline.New("wordcount-demo", pipeline.CheckpointDir(dir+"/job"), pipeline.CheckpointInterval(f.interval),
		pipeline.StatusAddress("127.0.0.1:0", w.listening))
	wordcount.Build(job, src, collect)
	fmt.Fprintf(out, "running the word-count job (checkpoint every %v)\n", f.interval)
	start := time.Now()
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.run(wctx) }()
	err = job.Run(ctx)
	stopWatch()
	wg.Wait()
	if err != nil {
		return err
	}
	took := time.Since(start)
	w.print(job.Status().Checkpoints) // Run returned: the final checkpoint is in

	mu.Lock()
	defer mu.Unlock()
	var words int64
	for _, wc := range counts {
		words += wc.Count
	}
	fmt.Fprintf(out, "job finished in %v: %d lines, %d words, %d distinct (%.0f lines/s)\n",
		took.Round(time.Millisecond), f.lines, words, len(counts), float64(f.lines)/took.Seconds())
	slices.SortFunc(counts, func(a, b wordcount.WordCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Word, b.Word))
	})
	fmt.Fprintf(out, "top %d words:\n", min(f.top, len(counts)))
	for _, wc := range counts[:min(f.top, len(counts))] {
		fmt.Fprintf(out, "  %-14s %d\n", wc.Word, wc.Count)
	}
	fmt.Fprintln(out, "runnel demo: done")
	return nil
}

// produceWithBar produces lines with a progress bar on out.
func produceWithBar(ctx context.Context, c *client.Client, topic string, lines []string, out io.Writer) error {
	p, err := client.NewProducer(c, "demo_producer")
	if err != nil {
		return err
	}
	defer p.Close()
	bar := progressbar.NewOptions(len(lines), progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("producing"),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("lines"),
		progressbar.OptionSetWidth(30), progressbar.OptionThrottle(50*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }))
	err = wordcount.Produce(ctx, c, p, topic, lines, func(n int) { _ = bar.Set(n) })
	if ferr := bar.Finish(); err == nil {
		err = ferr
	}
	return err
}

// checkpointWatcher prints completed checkpoints, read from the job's status
// endpoint while the job runs (the documented way to watch a running job).
type checkpointWatcher struct {
	out     io.Writer
	addr    chan string // the status endpoint's address, once listening
	mu      sync.Mutex
	printed map[uint64]bool
}

func (w *checkpointWatcher) listening(addr string) {
	w.mu.Lock()
	fmt.Fprintf(w.out, "status page: http://%s/ui/ (JSON at /status) while the job runs\n", addr)
	w.mu.Unlock()
	select {
	case w.addr <- addr:
	default:
	}
}

func (w *checkpointWatcher) run(ctx context.Context) {
	var addr string
	select {
	case addr = <-w.addr:
	case <-ctx.Done():
		return
	}
	hc := &http.Client{Timeout: time.Second}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
		if err != nil {
			return
		}
		resp, err := hc.Do(req)
		if err != nil {
			continue // the job is ending; the final status is printed after Run
		}
		var st runtime.Status
		err = json.NewDecoder(resp.Body).Decode(&st)
		_ = resp.Body.Close()
		if err == nil {
			w.print(st.Checkpoints)
		}
	}
}

// print prints the checkpoints (newest first, as Status lists them) not
// printed yet, oldest first.
func (w *checkpointWatcher) print(cps []runtime.CheckpointStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(cps) - 1; i >= 0; i-- {
		cp := cps[i]
		if w.printed[cp.ID] {
			continue
		}
		w.printed[cp.ID] = true
		fmt.Fprintf(w.out, "checkpoint %d %s in %v (%d bytes, %d state changes)\n",
			cp.ID, cp.Result, cp.Duration.Round(10*time.Microsecond), cp.Bytes, cp.StateChanges)
	}
}
