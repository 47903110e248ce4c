package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
)

type scaleoutDemoFlags struct {
	orders       int
	customers    int
	invalidEvery int
	workers      int
	queues       int
	ranges       int
	standbys     int
	partitioned  bool
	interval     time.Duration
	killAt       float64
	kill         int
	lockExpiry   time.Duration
	seed         uint64
	timeout      time.Duration
}

// newDemoScaleoutCmd is `runnel demo scaleout`: the ETL job as several
// worker processes of one job, one of them SIGKILLed and replaced by a
// worker on an empty state directory.
func newDemoScaleoutCmd() *cobra.Command {
	f := scaleoutDemoFlags{}
	cmd := &cobra.Command{
		Use:   "scaleout",
		Short: "Run the ETL job as 3 worker processes; SIGKILL one, replace it by one on an empty disk",
		Long: `Starts an embedded RocketMQ name server and broker on free loopback ports with a
temporary data directory and runs the exactly-once ETL job of examples/etl as
--workers worker processes of one job (pipeline.RunWorker: same -group, each its
own state directory). RocketMQ shares the work: each queue of the input topic is
a task, and so is each key-group range of the per-customer count (fed through
the job's repartition topic), owned by one worker at a time; each task's
commit chain and state changelog live in the broker.

Half of the sample orders are produced first. Once part of them is committed,
one worker is killed with SIGKILL: its tasks move to the others, which rebuild
their state from the broker. Then a new worker starts on an EMPTY state
directory and takes its share of the tasks, again restoring their state from the
broker. The other half of the orders follows. The demo prints which worker owns
how many tasks and each hand-off (read from the workers' /status), then reads
the output and dead-letter topics back and checks them: every valid order
exactly once with the right per-customer count, every invalid one in the DLQ.
Exits 0 only when that holds.

While it runs, ` + "`runnel job tasks etl --namesrv ADDR`" + ` shows the assignment too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runScaleoutDemo(cmd.Context(), f, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.orders, "orders", 20_000, "sample orders to produce (half before the kill, half after the replacement joined)")
	fl.IntVar(&f.customers, "customers", 200, "distinct customers of the sample orders")
	fl.IntVar(&f.invalidEvery, "invalid-every", 25, "about one order in this many is invalid (0: none)")
	fl.IntVar(&f.workers, "workers", 3, "worker processes")
	fl.IntVar(&f.queues, "queues", 8, "queues of the input topic (one task each)")
	fl.IntVar(&f.ranges, "ranges", 8, "key-group ranges of the per-customer count (one task each)")
	fl.IntVar(&f.standbys, "standbys", 0, "warm standby copies of each task's state on other workers")
	fl.BoolVar(&f.partitioned, "partitioned", false, "count customers in their input queue's task (the input is partitioned by customer): no repartition topic")
	fl.DurationVar(&f.interval, "interval", 200*time.Millisecond, "checkpoint interval of the job")
	fl.Float64Var(&f.killAt, "kill-at", 0.5, "SIGKILL a worker once this share of the first half's outputs is committed")
	fl.IntVar(&f.kill, "kill", 2, "the worker to SIGKILL (1..--workers)")
	fl.DurationVar(&f.lockExpiry, "lock-expiry", 60*time.Second, "how long the embedded broker keeps a queue lock that is not renewed (Apache RocketMQ's rocketmq.broker.rebalance.lockMaxLiveTime)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the sample orders")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up when the demo has not finished by then")
	return cmd
}

// soWorker is one worker process of the scale-out demo.
type soWorker struct {
	n    int // 1-based, in start order
	dir  string
	job  *demoJob
	url  string // its status page
	id   string // its client id (from its status)
	dead bool
}

func (w *soWorker) String() string { return fmt.Sprintf("worker %d", w.n) }

// soTask is a task as its owner's status shows it.
type soTask struct {
	owner *soWorker
	pipeline.WorkerTask
}

// soView is the job's assignment as the live workers' statuses show it.
type soView struct {
	tasks map[string][]soTask // by task id: the live workers that list it
	all   []string            // every task of the job (the commit chains')
}

// settled reports whether every task is owned by exactly one live worker
// and running.
func (v *soView) settled() bool {
	if len(v.all) == 0 {
		return false
	}
	for _, id := range v.all {
		ts := v.tasks[id]
		if len(ts) != 1 || ts[0].State != "running" {
			return false
		}
	}
	return true
}

// owners maps each task to its owner (settled views).
func (v *soView) owners() map[string]*soWorker {
	m := make(map[string]*soWorker, len(v.tasks))
	for id, ts := range v.tasks {
		if len(ts) == 1 {
			m[id] = ts[0].owner
		}
	}
	return m
}

type scaleoutDemo struct {
	f       scaleoutDemoFlags
	out     io.Writer
	exe     string
	c       *client.Client
	ns      string
	base    string
	workers []*soWorker
	http    *http.Client
}

func runScaleoutDemo(ctx context.Context, f scaleoutDemoFlags, out io.Writer) (err error) {
	switch {
	case f.orders < 2 || f.customers < 1 || f.invalidEvery < 0:
		return errors.New("demo scaleout: --orders must be at least 2, --customers at least 1, --invalid-every not negative")
	case f.workers < 2 || f.workers > 16:
		return errors.New("demo scaleout: --workers must be between 2 and 16 (one is killed)")
	case f.queues < 1 || f.queues > 64 || f.ranges < 1 || f.ranges > 64:
		return errors.New("demo scaleout: --queues and --ranges must be between 1 and 64")
	case f.standbys < 0 || f.standbys >= f.workers:
		return errors.New("demo scaleout: --standbys must be between 0 and --workers - 1")
	case f.interval <= 0 || f.killAt <= 0 || f.killAt > 1:
		return errors.New("demo scaleout: --interval must be positive, --kill-at in (0, 1]")
	case f.lockExpiry <= 0:
		return errors.New("demo scaleout: --lock-expiry must be positive")
	case f.kill < 1 || f.kill > f.workers:
		return fmt.Errorf("demo scaleout: --kill %d: not one of workers 1..%d", f.kill, f.workers)
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	env, err := startDemoEnv(ctx, out, embedded.WithBrokerOptions(broker.WithLockExpiry(f.lockExpiry)))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.Close()) }()
	c := env.c
	if err := etl.EnsureTopics(ctx, c, env.cl.BrokerAddr(), f.queues, etl.DefaultIn, etl.DefaultOut); err != nil {
		return err
	}
	if err := etl.EnsureTopics(ctx, c, env.cl.BrokerAddr(), 2, etl.DefaultDLQ); err != nil {
		return err
	}
	d := &scaleoutDemo{f: f, out: out, exe: exe, c: c, ns: env.cl.NameServer(), base: env.dir, http: &http.Client{Timeout: 3 * time.Second}}
	defer d.killAll()

	samples := etl.SampleOrders(f.orders, f.customers, f.invalidEvery, f.seed)
	half := len(samples) / 2
	var valid, invalid, validFirst int64
	for i := range samples {
		switch {
		case !samples[i].Valid:
			invalid++
		case i < half:
			validFirst++
			valid++
		default:
			valid++
		}
	}
	fmt.Fprintf(out, "producing the first %d of %d orders (%d invalid in all) of %d customers to topic %s (%d queues)\n",
		half, f.orders, invalid, f.customers, etl.DefaultIn, f.queues)
	if err := produceOrders(ctx, c, samples[:half], out); err != nil {
		return err
	}

	mode := fmt.Sprintf("%d key-group ranges of the per-customer count, fed through the job's repartition topic", f.ranges)
	if f.partitioned {
		mode = "the per-customer count in each queue's task (-partitioned)"
	}
	fmt.Fprintf(out, "starting %d ETL workers of job %s as child processes (checkpoint every %v): %d input queues, %s\n",
		f.workers, etl.DefaultGroup, f.interval, f.queues, mode)
	start := time.Now()
	for range f.workers {
		if _, err := d.startWorker(ctx); err != nil {
			return err
		}
	}
	v, err := d.waitView(ctx, "every task to be running", 0, func(v *soView) bool { return v.settled() })
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "the workers share %s after %v:\n", plural(int64(len(v.all)), "task"), time.Since(start).Round(time.Millisecond))
	d.printAssignment(v)
	fmt.Fprintf(out, "(`runnel job tasks %s --namesrv %s` shows the same from the commit chains)\n", etl.DefaultGroup, d.ns)

	killAt := max(int64(float64(validFirst)*f.killAt), 1)
	n, err := d.waitOutputs(ctx, func(o, _ int64) bool { return o >= killAt }, nil)
	if err != nil {
		return err
	}
	// The assignment as of the kill (it may have changed since the first).
	if v, err = d.waitView(ctx, "every task to be running", 0, func(v *soView) bool { return v.settled() }); err != nil {
		return err
	}
	victim := d.workers[f.kill-1]
	before := v.owners()
	var lost []string
	for _, id := range v.all {
		if before[id] == victim {
			lost = append(lost, id)
		}
	}
	_ = victim.job.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.job.done
	victim.dead = true
	killed := time.Now()
	fmt.Fprintf(out, "%v killed with SIGKILL after %d of %d outputs were committed; it owned %s\n", victim, n, valid, plural(int64(len(lost)), "task"))
	v, err = d.waitView(ctx, "the killed worker's tasks to run elsewhere", 0, func(v *soView) bool { return v.settled() })
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%v's %s moved in %v: %s\n", victim, plural(int64(len(lost)), "task"), time.Since(killed).Round(time.Millisecond), d.moves(lost, before, v, "to"))

	// Tasks taken over from the killed worker run without their queue lock
	// until the broker expires the dead worker's (the commit chain fences
	// it meanwhile).
	lockless := map[string]bool{}
	for id, ts := range v.tasks {
		if !ts[0].Locked {
			lockless[id] = true
		}
	}
	repl, err := d.startWorker(ctx)
	if err != nil {
		return err
	}
	joined := time.Now()
	fmt.Fprintf(out, "%v started on an empty state directory\n", repl)
	before = v.owners()
	v, err = d.waitView(ctx, "the new worker to take its share", time.Second, func(v *soView) bool {
		if !v.settled() {
			return false
		}
		for _, ts := range v.tasks {
			if ts[0].owner == repl {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	var gained []string
	for id, w := range v.owners() {
		if w == repl {
			gained = append(gained, id)
		}
	}
	slices.Sort(gained)
	fmt.Fprintf(out, "%v took %s in %v: %s\n", repl, plural(int64(len(gained)), "task"), time.Since(joined).Round(time.Millisecond), d.moves(gained, before, v, "from"))
	waited := 0
	for _, id := range gained {
		if lockless[id] {
			waited++
		}
	}
	if waited > 0 {
		fmt.Fprintf(out, "(%d of them had been taken over from %v without the queue lock, which the broker keeps for the dead worker until it expires (--lock-expiry %v): %v waited for that)\n",
			waited, victim, f.lockExpiry, repl)
	}
	fmt.Fprintln(out, "the tasks now:")
	d.printAssignment(v)

	fmt.Fprintf(out, "producing the other %d orders\n", len(samples)-half)
	if err := produceOrders(ctx, c, samples[half:], out); err != nil {
		return err
	}
	bar := progressbar.NewOptions64(valid, progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("committed"),
		progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }))
	_, err = d.waitOutputs(ctx, func(o, dl int64) bool { return o >= valid && dl >= invalid }, func(o int64) { _ = bar.Set64(min(o, valid)) })
	if ferr := bar.Finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	if err := d.stopAll(); err != nil {
		return err
	}
	took := time.Since(start)
	fmt.Fprintf(out, "workers stopped on SIGTERM after a final checkpoint (%v, %.0f orders/s including the kill and the hand-offs)\n",
		took.Round(time.Millisecond), float64(f.orders)/took.Seconds())
	return verifyETL(ctx, c, samples, out, "a SIGKILLed worker and its replacement on an empty disk lost and duplicated nothing")
}

// statusLine is the log line by which a worker says where its status is.
var statusLine = regexp.MustCompile(`msg="` + regexp.QuoteMeta(etl.StatusLogMsg) + `" url=(\S+)`)

// startWorker starts a new worker on an empty state directory and waits
// for its status address and client id.
func (d *scaleoutDemo) startWorker(ctx context.Context) (*soWorker, error) {
	w := &soWorker{n: len(d.workers) + 1}
	w.dir = filepath.Join(d.base, fmt.Sprintf("worker-%d", w.n))
	args := []string{"demo", "etl-job", "-namesrv", d.ns, "-state", w.dir, "-group", etl.DefaultGroup,
		"-checkpoint-interval", d.f.interval.String(), "-status", "127.0.0.1:0", "-ranges", fmt.Sprint(d.f.ranges),
		"-standbys", fmt.Sprint(d.f.standbys)}
	if d.f.partitioned {
		args = append(args, "-partitioned")
	}
	j, err := startDemoJob(d.exe, args)
	if err != nil {
		return nil, err
	}
	w.job = j
	d.workers = append(d.workers, w)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for w.id == "" {
		if err := d.exited(w); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("demo scaleout: %v did not serve its status: %w\n%s", w, ctx.Err(), j.out.String())
		case <-t.C:
		}
		if w.url == "" {
			if m := statusLine.FindStringSubmatch(j.out.String()); m != nil {
				w.url = m[1]
			}
			continue
		}
		if st, err := d.status(ctx, w); err == nil {
			w.id = st.Worker
		}
	}
	return w, nil
}

// errWorkerExited is returned when a worker process ended by itself.
var errWorkerExited = errors.New("demo scaleout: a worker exited")

// exited returns an error wrapping errWorkerExited, with its output, when
// the live worker w has ended.
func (d *scaleoutDemo) exited(w *soWorker) error {
	if w.dead {
		return nil
	}
	select {
	case err := <-w.job.done:
		w.dead = true
		return fmt.Errorf("%w: %v: %v\n%s", errWorkerExited, w, err, w.job.out.String())
	default:
		return nil
	}
}

// status fetches w's /status.
func (d *scaleoutDemo) status(ctx context.Context, w *soWorker) (*pipeline.WorkerStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url+"status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%v's status: %s", w, resp.Status)
	}
	var st pipeline.WorkerStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("%v's status: %w", w, err)
	}
	return &st, nil
}

// view asks every live worker for its status.
func (d *scaleoutDemo) view(ctx context.Context) (*soView, error) {
	v := &soView{tasks: map[string][]soTask{}}
	for _, w := range d.workers {
		if w.dead {
			continue
		}
		if err := d.exited(w); err != nil {
			return nil, err
		}
		st, err := d.status(ctx, w)
		if err != nil {
			return nil, err
		}
		for _, t := range st.Tasks {
			v.tasks[t.Task] = append(v.tasks[t.Task], soTask{owner: w, WorkerTask: t})
		}
		if len(st.Chains) > len(v.all) {
			v.all = v.all[:0]
			for _, ch := range st.Chains {
				v.all = append(v.all, ch.Task)
			}
		}
	}
	return v, nil
}

// waitView polls the workers' statuses until cond has held for stable (at
// least one poll), a worker exits or ctx ends.
func (d *scaleoutDemo) waitView(ctx context.Context, what string, stable time.Duration, cond func(*soView) bool) (*soView, error) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var since time.Time
	var last *soView
	var lastErr error
	for {
		v, err := d.view(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, fmt.Errorf("demo scaleout: waiting for %s: %w (last status error: %v)\n%s", what, ctx.Err(), lastErr, d.logs())
		case errors.Is(err, errWorkerExited):
			return nil, err
		case err != nil:
			lastErr = err // a status request failed: asked again
			since = time.Time{}
		case cond(v):
			if since.IsZero() || !sameOwners(last, v) {
				since = time.Now()
			}
			if time.Since(since) >= stable {
				return v, nil
			}
		default:
			since = time.Time{}
		}
		last = v
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("demo scaleout: waiting for %s: %w\n%s", what, ctx.Err(), d.logs())
		case <-t.C:
		}
	}
}

func sameOwners(a, b *soView) bool {
	if a == nil || b == nil {
		return false
	}
	return maps.Equal(a.owners(), b.owners())
}

// printAssignment prints how many tasks each live worker owns, per stage.
func (d *scaleoutDemo) printAssignment(v *soView) {
	owners := v.owners()
	for _, w := range d.workers {
		if w.dead {
			continue
		}
		per := map[string]int{}
		n := 0
		for id, o := range owners {
			if o == w {
				n++
				if tid, err := scaleout.ParseTaskID(id); err == nil {
					per[tid.Stage]++
				}
			}
		}
		var by []string
		for _, s := range slices.Sorted(maps.Keys(per)) {
			by = append(by, fmt.Sprintf("%s %d", s, per[s]))
		}
		fmt.Fprintf(d.out, "  %v (%s): %s (%s)\n", w, w.id, plural(int64(n), "task"), strings.Join(by, ", "))
	}
}

// moves describes where the tasks ids went (dir "to": their new owners in
// v) or came from (dir "from": their owners before), and how their state
// was restored.
func (d *scaleoutDemo) moves(ids []string, before map[string]*soWorker, v *soView, dir string) string {
	if len(ids) == 0 {
		return "none"
	}
	count := map[*soWorker]int{}
	var slowest time.Duration
	var bytes int64
	reused, snapshots, segments := 0, 0, 0
	for _, id := range ids {
		ts := v.tasks[id]
		if len(ts) != 1 {
			continue
		}
		w := ts[0].owner
		if dir == "from" {
			w = before[id]
		}
		count[w]++
		if r := ts[0].Restore; r != nil {
			slowest = max(slowest, r.Duration)
			bytes += r.Bytes
			segments += r.Segments
			if r.Reused {
				reused++
			}
			if r.FromSnapshot {
				snapshots++
			}
		}
	}
	var parts []string
	for _, w := range d.workers {
		if n := count[w]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s %v", n, dir, w))
		}
	}
	if n := count[nil]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d that had no owner", n))
	}
	var how []string
	if reused > 0 {
		// A store on the new owner's disk whose checkpoint lies on the
		// task's chain: a standby's copy, or its own from when it owned
		// the task before.
		from := "the new owner's own earlier copy on its disk"
		if d.f.standbys > 0 {
			from = "a copy on the new owner's disk (a standby's, or its own earlier one)"
		}
		how = append(how, fmt.Sprintf("%d resumed from %s", reused, from))
	}
	if n := len(ids) - reused; n > 0 {
		r := fmt.Sprintf("%d restored from the broker", n)
		if snapshots > 0 {
			r += fmt.Sprintf(" (%d from a snapshot)", snapshots)
		}
		how = append(how, r)
	}
	how = append(how, fmt.Sprintf("%d changelog segments, %s applied", segments, kib(bytes)))
	return fmt.Sprintf("%s; state: %s, the slowest restore %v", strings.Join(parts, ", "), strings.Join(how, ", "), slowest.Round(time.Millisecond))
}

func kib(n int64) string {
	if n < 10*1024 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%d KiB", n/1024)
}

// waitOutputs polls the committed output and dead-letter counts until cond
// holds, a live worker exits (an error) or ctx ends.
func (d *scaleoutDemo) waitOutputs(ctx context.Context, cond func(out, dlq int64) bool, progress func(int64)) (int64, error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var lastErr error
	for {
		for _, w := range d.workers {
			if err := d.exited(w); err != nil {
				return 0, err
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("demo scaleout: %w (last count error: %v)\n%s", ctx.Err(), lastErr, d.logs())
		case <-t.C:
		}
		o, err := etl.Count(ctx, d.c, etl.DefaultOut)
		if err != nil {
			lastErr = err // counted again at the next tick
			continue
		}
		dl, err := etl.Count(ctx, d.c, etl.DefaultDLQ)
		if err != nil {
			lastErr = err
			continue
		}
		if progress != nil {
			progress(o)
		}
		if cond(o, dl) {
			return o, nil
		}
	}
}

// stopAll stops the live workers with SIGTERM (each takes a final
// checkpoint) and waits for them.
func (d *scaleoutDemo) stopAll() error {
	var live []*soWorker
	for _, w := range d.workers {
		if !w.dead {
			_ = w.job.cmd.Process.Signal(syscall.SIGTERM)
			live = append(live, w)
		}
	}
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, w := range live {
		select {
		case err := <-w.job.done:
			w.dead = true
			if err != nil {
				errs = append(errs, fmt.Errorf("demo scaleout: %v did not stop cleanly on SIGTERM: %w\n%s", w, err, w.job.out.String()))
			}
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("demo scaleout: %v did not stop within a minute of SIGTERM\n%s", w, w.job.out.String()))
		}
	}
	return errors.Join(errs...) // killAll ends those that did not stop
}

// killAll SIGKILLs the workers still running (the demo failed) and waits
// for them.
func (d *scaleoutDemo) killAll() {
	for _, w := range d.workers {
		if !w.dead {
			_ = w.job.cmd.Process.Kill()
			<-w.job.done
			w.dead = true
		}
	}
}

// logs is the tail of every worker's output, for errors.
func (d *scaleoutDemo) logs() string {
	var b strings.Builder
	for _, w := range d.workers {
		s := w.job.out.String()
		if len(s) > 4000 {
			s = "..." + s[len(s)-4000:]
		}
		fmt.Fprintf(&b, "== %v\n%s\n", w, s)
	}
	return b.String()
}
