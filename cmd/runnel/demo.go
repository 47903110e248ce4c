package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/transport/client"
)

type etlDemoFlags struct {
	orders       int
	customers    int
	invalidEvery int
	interval     time.Duration
	killAt       float64
	seed         uint64
	timeout      time.Duration
}

// newDemoCmd is `runnel demo` (what `make run` runs): the exactly-once ETL
// job of examples/etl end to end on an embedded name server and broker,
// killed with SIGKILL once mid-way and restarted. `runnel demo wordcount`
// is the word-count demo, `runnel demo scaleout` the ETL job on several
// worker processes.
func newDemoCmd() *cobra.Command {
	f := etlDemoFlags{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the exactly-once ETL demo end to end on an embedded broker (SIGKILL and restart included)",
		Long: `Starts an embedded RocketMQ name server and broker on free loopback ports with a
temporary data directory, produces sample orders (some invalid) with a progress
bar, and runs the ETL job of examples/etl (decode + validate, invalid orders to
the dead-letter topic, per-customer counts in keyed state, EUR amounts, exactly
once into orders-enriched) as a child process. Mid-way the job is killed with
SIGKILL and started again; it resumes from its last checkpoint. Finally the
output and dead-letter topics are read back and checked: every valid order
exactly once with the right per-customer count, every invalid one in the DLQ.
Exits 0 only when that holds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runETLDemo(cmd.Context(), f, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.orders, "orders", 20_000, "sample orders to produce")
	fl.IntVar(&f.customers, "customers", 200, "distinct customers of the sample orders")
	fl.IntVar(&f.invalidEvery, "invalid-every", 25, "about one order in this many is invalid (0: none)")
	fl.DurationVar(&f.interval, "interval", 200*time.Millisecond, "checkpoint interval of the job")
	fl.Float64Var(&f.killAt, "kill-at", 0.4, "SIGKILL the job once this share of the output is committed")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the sample orders")
	fl.DurationVar(&f.timeout, "timeout", 3*time.Minute, "give up when the job has not finished by then")
	cmd.AddCommand(newDemoWordcountCmd(), newDemoScaleoutCmd(), newDemoETLJobCmd())
	return cmd
}

// newDemoETLJobCmd is the demo's job process: examples/etl's command line.
func newDemoETLJobCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "etl-job",
		Short:              "The ETL job process of `runnel demo` (examples/etl's flags)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return etl.Main(cmd.Context(), "runnel demo etl-job", args, cmd.ErrOrStderr())
		},
	}
}

func runETLDemo(ctx context.Context, f etlDemoFlags, out io.Writer) (err error) {
	if f.orders < 1 || f.customers < 1 || f.invalidEvery < 0 || f.interval <= 0 || f.killAt <= 0 || f.killAt >= 1 {
		return errors.New("demo: --orders and --customers must be at least 1, --interval positive, --kill-at in (0, 1)")
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	env, err := startDemoEnv(ctx, out)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.Close()) }()
	dir, cl, c := env.dir, env.cl, env.c
	if err := etl.EnsureTopics(ctx, c, cl.BrokerAddr(), 4, etl.DefaultIn, etl.DefaultOut, etl.DefaultDLQ); err != nil {
		return err
	}

	samples := etl.SampleOrders(f.orders, f.customers, f.invalidEvery, f.seed)
	var valid, invalid int64
	for i := range samples {
		if samples[i].Valid {
			valid++
		} else {
			invalid++
		}
	}
	fmt.Fprintf(out, "producing %d orders (%d invalid) of %d customers to topic %s\n", f.orders, invalid, f.customers, etl.DefaultIn)
	if err := produceOrders(ctx, c, samples, out); err != nil {
		return err
	}

	args := []string{"demo", "etl-job", "-namesrv", cl.NameServer(), "-state", filepath.Join(dir, "job"),
		"-checkpoint-interval", f.interval.String(), "-status", "127.0.0.1:0"}
	fmt.Fprintf(out, "running the ETL job as a child process (checkpoint every %v): %s -> %s, invalid -> %s\n",
		f.interval, etl.DefaultIn, etl.DefaultOut, etl.DefaultDLQ)
	start := time.Now()
	job, err := startDemoJob(exe, args)
	if err != nil {
		return err
	}
	killAt := int64(float64(valid) * f.killAt)
	n, err := waitOutputs(ctx, c, job, func(o, _ int64) bool { return o >= killAt }, nil)
	if err != nil {
		return err
	}
	_ = job.cmd.Process.Signal(syscall.SIGKILL)
	<-job.done
	fmt.Fprintf(out, "killed the job with SIGKILL after %d of %d outputs were committed; restarting it\n", n, valid)
	if job, err = startDemoJob(exe, args); err != nil {
		return err
	}
	if url := awaitStatusURL(ctx, job, 10*time.Second); url != "" {
		fmt.Fprintf(out, "status page: %s (JSON at %sstatus) while the job runs\n", url, url)
	}
	bar := progressbar.NewOptions64(valid, progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("committed"),
		progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }))
	_, err = waitOutputs(ctx, c, job, func(o, d int64) bool { return o >= valid && d >= invalid }, func(o int64) { _ = bar.Set64(min(o, valid)) })
	if ferr := bar.Finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	_ = job.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-job.done; err != nil {
		return fmt.Errorf("demo: the job did not stop cleanly on SIGTERM: %w\n%s", err, job.out.String())
	}
	took := time.Since(start)
	fmt.Fprintf(out, "job stopped on SIGTERM after a final checkpoint (%v, %.0f orders/s including the restart)\n",
		took.Round(time.Millisecond), float64(f.orders)/took.Seconds())

	return verifyETL(ctx, c, samples, out, "a SIGKILL mid-way lost and duplicated nothing")
}

// verifyETL reads the ETL demo's output and dead-letter topics back, prints
// the oracle's verdict (etl.Verify) and fails unless it holds; okWhy says
// what the OK proves.
func verifyETL(ctx context.Context, c *client.Client, samples []etl.Sample, out io.Writer, okWhy string) error {
	outMsgs, err := etl.ReadAll(ctx, c, etl.DefaultOut)
	if err != nil {
		return err
	}
	dlqMsgs, err := etl.ReadAll(ctx, c, etl.DefaultDLQ)
	if err != nil {
		return err
	}
	r := etl.Verify(samples, outMsgs, dlqMsgs)
	fmt.Fprintf(out, "read back %d output and %d dead-letter messages\n", len(outMsgs), len(dlqMsgs))
	fmt.Fprintf(out, "  valid orders:   %d, each exactly once: missing %d, duplicated %d\n", r.Valid, r.Missing, r.Duplicated)
	fmt.Fprintf(out, "  per customer:   counts in order %d/%d, wrong values %d, unexpected %d\n", r.Output-r.OutOfOrder, r.Output, r.WrongValue, r.Unexpected)
	fmt.Fprintf(out, "  invalid orders: %d, in the DLQ exactly once: missing %d, duplicated %d, unexpected %d\n", r.Invalid, r.DLQMissing, r.DLQDuplicated, r.DLQUnexpected)
	if !r.OK() {
		for _, ex := range r.Examples {
			fmt.Fprintln(out, "  -", ex)
		}
		return fmt.Errorf("demo: exactly-once violated: %s", r)
	}
	fmt.Fprintf(out, "exactly-once: OK (%s)\n", okWhy)
	fmt.Fprintln(out, "runnel demo: done")
	return nil
}

// produceOrders produces the samples with a progress bar on out.
func produceOrders(ctx context.Context, c *client.Client, samples []etl.Sample, out io.Writer) error {
	p, err := client.NewProducer(c, "demo_orders")
	if err != nil {
		return err
	}
	defer p.Close()
	bar := progressbar.NewOptions(len(samples), progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("producing"),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("orders"),
		progressbar.OptionSetWidth(30), progressbar.OptionThrottle(50*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }))
	err = etl.Produce(ctx, c, p, etl.DefaultIn, samples, func(n int) { _ = bar.Set(n) })
	if ferr := bar.Finish(); err == nil {
		err = ferr
	}
	return err
}

// awaitStatusURL waits up to d for the job's status line and returns its
// URL ("" when it did not come: the demo goes on without it).
func awaitStatusURL(ctx context.Context, j *demoJob, d time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if m := statusLine.FindStringSubmatch(j.out.String()); m != nil {
			return m[1]
		}
		select {
		case <-ctx.Done():
			return ""
		case <-t.C:
		}
	}
}

// demoJob is a running child job process.
type demoJob struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error
}

func startDemoJob(exe string, args []string) (*demoJob, error) {
	j := &demoJob{cmd: exec.Command(exe, args...), out: &syncbuf.Buffer{}, done: make(chan error, 1)}
	j.cmd.Stdout, j.cmd.Stderr = j.out, j.out
	if err := j.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { j.done <- j.cmd.Wait() }()
	return j, nil
}

// waitOutputs polls the committed output and dead-letter counts until cond
// holds, the job exits (an error) or ctx ends (the job is killed).
func waitOutputs(ctx context.Context, c *client.Client, j *demoJob, cond func(out, dlq int64) bool, progress func(int64)) (int64, error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var lastErr error // of the latest count; reported if ctx ends
	for {
		select {
		case err := <-j.done:
			return 0, fmt.Errorf("demo: the job exited early: %v\n%s", err, j.out.String())
		case <-ctx.Done():
			_ = j.cmd.Process.Kill()
			<-j.done
			return 0, fmt.Errorf("demo: %w (last count error: %v)\n%s", ctx.Err(), lastErr, j.out.String())
		case <-t.C:
		}
		o, err := etl.Count(ctx, c, etl.DefaultOut)
		if err != nil {
			lastErr = err // counted again at the next tick
			continue
		}
		d, err := etl.Count(ctx, c, etl.DefaultDLQ)
		if err != nil {
			lastErr = err
			continue
		}
		if progress != nil {
			progress(o)
		}
		if cond(o, d) {
			return o, nil
		}
	}
}
