package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/pipeline"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Sizes of the scale-out benchmarks, overridable for a fuller run.
const (
	envSOOrders = "RUNNEL_BENCH_SO_ORDERS" // BenchmarkScaleoutETL's input (default 100k orders; -short 20k)
	envSOKills  = "RUNNEL_BENCH_SO_KILLS"  // BenchmarkScaleoutFailover's kills per op (default 3; -short 2)

	soQueues    = 8 // the input topic's queues (and the keyed stage's ranges)
	soCustomers = 1000
)

func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// BenchmarkScaleoutETL measures examples/etl's job over the same preloaded
// input (8 queues, 1000 customers, one order in 100 invalid; exactly-once
// output) in three modes, in the same run: today's single-process job
// (etl.Config.SingleProcess, pipeline.Job.Run), the job as one worker
// process (pipeline.RunWorker), and as three. topo=repart is the job as
// written (its keyed stage fed through the job's repartition topic, 8
// ranges); topo=partitioned declares the input partitioned by customer
// (etl.Config.Partitioned: no repartition topic; mode=single is the same
// job in both). Every process runs apart, the broker included, each a
// child of this benchmark: cpu-ns/record is the CPU time of all of them
// (the workers' from their rusage, start to exit, the broker's from /proc
// over the same span) per input order; worker- and broker-cpu-ns/record
// split it. One op is one job over the whole input, from starting the
// processes until every output and dead letter is committed (records/s)
// and they have stopped with SIGTERM (ns/op). That includes each mode's
// fixed costs (processes, a Pebble store per task, group join, claims,
// final checkpoints), which the input (RUNNEL_BENCH_SO_ORDERS, default
// 100k orders) amortizes. Compare with -col /mode.
func BenchmarkScaleoutETL(b *testing.B) {
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	n = envInt(b, envSOOrders, n)
	sb := startSOBroker(b)
	in := "so_bench_orders"
	sb.createTopic(b, in, soQueues)
	samples := etl.SampleOrders(n, soCustomers, 100, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p, err := client.NewProducer(sb.c, "so_bench_input")
	if err != nil {
		b.Fatal(err)
	}
	err = etl.Produce(ctx, sb.c, p, in, samples, nil)
	_ = p.Close()
	if err != nil {
		b.Fatal(err)
	}
	var valid, invalid int64
	for i := range samples {
		if samples[i].Valid {
			valid++
		} else {
			invalid++
		}
	}
	seq := 0
	for _, topo := range []string{"repart", "partitioned"} {
		for _, mode := range []string{"single", "workers1", "workers3"} {
			b.Run("topo="+topo+"/mode="+mode, func(b *testing.B) {
				var sum soETLResult
				for range b.N {
					seq++
					r := runSOETL(b, sb, soETLRun{in: in, seq: seq, topo: topo, mode: mode, valid: valid, invalid: invalid})
					sum.took, sum.workerCPU, sum.brokerCPU = sum.took+r.took, sum.workerCPU+r.workerCPU, sum.brokerCPU+r.brokerCPU
				}
				recs := float64(b.N) * float64(n)
				b.ReportMetric(recs/sum.took.Seconds(), "records/s")
				b.ReportMetric(float64((sum.workerCPU+sum.brokerCPU).Nanoseconds())/recs, "cpu-ns/record")
				b.ReportMetric(float64(sum.workerCPU.Nanoseconds())/recs, "worker-cpu-ns/record")
				b.ReportMetric(float64(sum.brokerCPU.Nanoseconds())/recs, "broker-cpu-ns/record")
			})
		}
	}
}

type soETLRun struct {
	in             string
	seq            int
	topo, mode     string
	valid, invalid int64
}

type soETLResult struct {
	took                 time.Duration // start to the last output committed
	workerCPU, brokerCPU time.Duration
}

func runSOETL(b *testing.B, sb *soBroker, r soETLRun) soETLResult {
	b.Helper()
	b.StopTimer()
	job := fmt.Sprintf("so_etl_%d_%s_%s", r.seq, r.topo[:1], r.mode)
	out, dlq := job+"_out", job+"_dlq"
	sb.createTopic(b, out, soQueues)
	sb.createTopic(b, dlq, 2)
	n := 1
	if r.mode == "workers3" {
		n = 3
	}
	dir := b.TempDir()
	b.StartTimer()
	bc0 := sb.cpuNow(b)
	start := time.Now()
	procs := make([]*soProc, n)
	for i := range procs {
		name := fmt.Sprintf("w%d", i)
		procs[i] = startSOProc(b, name, soChildConfig{Role: "etl", Namesrv: sb.ns, Dir: filepath.Join(dir, name),
			Instance: job + "-" + name, Job: job, In: r.in, Out: out, DLQ: dlq, Interval: etl.DefaultInterval,
			Single: r.mode == "single", Partitioned: r.topo == "partitioned"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var res soETLResult
	for {
		o, d, err := soCommitted(ctx, sb.c, out, dlq)
		if err != nil {
			b.Fatal(err)
		}
		if o >= r.valid && d >= r.invalid {
			break
		}
		for _, p := range procs {
			if p.exited() {
				b.Fatalf("%s %s exited (%v) with %d/%d outputs and %d/%d dead letters committed:\n%s", job, p.name, p.err, o, r.valid, d, r.invalid, javapeer.Tail([]byte(p.out.String()), 50))
			}
		}
		if ctx.Err() != nil {
			b.Fatalf("%s: %d/%d outputs and %d/%d dead letters committed after 10 minutes", job, o, r.valid, d, r.invalid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.took = time.Since(start)
	for _, p := range procs {
		p.stop(b, 2*time.Minute)
		res.workerCPU += p.cpu()
	}
	res.brokerCPU = sb.cpuNow(b) - bc0
	b.StopTimer()
	// Exactly once: nothing more arrived while they stopped.
	o, d, err := soCommitted(ctx, sb.c, out, dlq)
	if err != nil {
		b.Fatal(err)
	}
	if o != r.valid || d != r.invalid {
		b.Fatalf("%s: %d outputs and %d dead letters committed, want %d and %d", job, o, d, r.valid, r.invalid)
	}
	b.StartTimer()
	return res
}

func soCommitted(ctx context.Context, c *client.Client, out, dlq string) (o, d int64, err error) {
	o, err = etl.Count(ctx, c, out)
	if err != nil {
		return 0, 0, err
	}
	d, err = etl.Count(ctx, c, dlq)
	return o, d, err
}

// BenchmarkScaleoutFailover measures failover of examples/etl's job as
// three worker processes (8-queue input, 8 ranges: 16 tasks) under a
// steady 500 orders/s, with and without a standby copy of every task
// (pipeline.Standbys): one op starts the three, then SIGKILLs one of them
// RUNNEL_BENCH_SO_KILLS times (default 3), each at a random instant once
// every task runs (and, with a standby, every copy has caught up), and
// restarts it on its own state directory after the failover.
//
// A dead worker's task is back when it produces output under its new
// owner: for a task with the output sink (the keyed stage), the first
// output record the benchmark reads whose runnel.task names it and whose
// runnel.owner is above the dead owner's epoch; for a source task (its
// output is the repartition topic, counted by readers once its checkpoint
// is published), its new owner's first published checkpoint on the commit
// chain. failover-p50/p99-ms are over every task of every kill (nearest
// rank: with fewer than 100, p99 is the worst); failover-all-* over the
// kills, each the time until the last of its tasks was back. The phases
// (p50 over tasks, from the new owner's /status) split it: detect-ms from
// the kill to the rebalance assigning the task, claim-ms from there to its
// claim on the commit chain (lock, claim record confirmed), restore-ms the
// restore of its state, first-output-ms from running to its output (at
// least one checkpoint interval, 1 s: output is committed per checkpoint).
// reused-frac is the share of tasks whose new owner had the state at hand
// (a standby's copy, or its own older copy still on the chain, applying
// the segments since) instead of rebuilding it from the broker.
func BenchmarkScaleoutFailover(b *testing.B) {
	kills := 3
	if testing.Short() {
		kills = 2
	}
	kills = envInt(b, envSOKills, kills)
	sb := startSOBroker(b)
	seq := 0
	for _, standbys := range []int{0, 1} {
		b.Run(fmt.Sprintf("standbys=%d", standbys), func(b *testing.B) {
			var res soFailoverResult
			for range b.N {
				seq++
				runSOFailover(b, sb, seq, standbys, kills, &res)
			}
			res.report(b)
		})
	}
}

// soFailoverResult collects the per-task and per-kill figures.
type soFailoverResult struct {
	task, all                      []time.Duration
	detect, claim, restore, output []time.Duration
	reused, tasks                  int
}

func (r *soFailoverResult) report(b *testing.B) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(percentile(r.task, 50)), "failover-p50-ms")
	b.ReportMetric(ms(percentile(r.task, 99)), "failover-p99-ms")
	b.ReportMetric(ms(percentile(r.all, 50)), "failover-all-p50-ms")
	b.ReportMetric(ms(percentile(r.all, 99)), "failover-all-p99-ms")
	b.ReportMetric(ms(percentile(r.detect, 50)), "detect-ms")
	b.ReportMetric(ms(percentile(r.claim, 50)), "claim-ms")
	b.ReportMetric(ms(percentile(r.restore, 50)), "restore-ms")
	b.ReportMetric(ms(percentile(r.output, 50)), "first-output-ms")
	if r.tasks > 0 {
		b.ReportMetric(float64(r.reused)/float64(r.tasks), "reused-frac")
	}
}

// percentile is the nearest-rank p-th percentile of ds (0 when empty).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// soWatch tracks the dead worker's tasks until each is back.
type soWatch struct {
	mu    sync.Mutex
	waits map[string]*soWait
}

type soWait struct {
	owner uint64    // the dead owner's epoch: back once a higher one produces
	chain bool      // a source task: watched on its commit chain
	back  time.Time // zero until back
}

// output is called for every output record read.
func (w *soWatch) output(task string, owner uint64, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt := w.waits[task]; wt != nil && !wt.chain && wt.back.IsZero() && owner > wt.owner {
		wt.back = at
	}
}

// pending returns the tasks not back yet.
func (w *soWatch) pending() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var p []string
	for t, wt := range w.waits {
		if wt.back.IsZero() {
			p = append(p, t)
		}
	}
	slices.Sort(p)
	return p
}

// tailOutput reads every queue of topic from its current end, calling
// seen with each record's task and owner epoch (its runnel.task and
// runnel.owner properties), until ctx ends.
func tailOutput(ctx context.Context, b *testing.B, c *client.Client, topic string, seen func(task string, owner uint64, at time.Time), wg *sync.WaitGroup) {
	r, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range r.SubscribeQueues() {
		off, err := c.MaxOffset(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 256, Suspend: time.Second, Group: "so_bench_tail"})
				if err != nil {
					if ctx.Err() == nil {
						time.Sleep(50 * time.Millisecond)
					}
					continue
				}
				now := time.Now()
				for i := range res.Messages {
					m := &res.Messages[i]
					task, _ := m.Property(mqsink.PropTask)
					ow, _ := m.Property(mqsink.PropOwner)
					owner, _ := strconv.ParseUint(ow, 10, 64)
					seen(task, owner, now)
				}
				if res.NextBeginOffset > off {
					off = res.NextBeginOffset
				}
			}
		})
	}
}

// soSteadyJob is examples/etl's job (8-queue input, 8 ranges: 16 tasks)
// under a steady 500 orders/s, its workers child processes on state
// directories of their own.
type soSteadyJob struct {
	b                 *testing.B
	sb                *soBroker
	job, in, out, dlq string
	standbys          int
	dir               string
	workers           []*soProc
	addrs             []string
	tasks             []string // every task: the source's, then the keyed stage's
}

// newSOSteadyJob creates the job's topics and starts its input (until ctx
// ends, joined by wg) and n workers.
func newSOSteadyJob(ctx context.Context, b *testing.B, sb *soBroker, wg *sync.WaitGroup, job string, n, standbys int) *soSteadyJob {
	b.Helper()
	j := &soSteadyJob{b: b, sb: sb, job: job, in: job + "_in", out: job + "_out", dlq: job + "_dlq", standbys: standbys, dir: b.TempDir(),
		workers: make([]*soProc, n), addrs: make([]string, n)}
	sb.createTopic(b, j.in, soQueues)
	sb.createTopic(b, j.out, soQueues)
	sb.createTopic(b, j.dlq, 2)
	route, err := sb.c.RefreshRoute(ctx, j.in)
	if err != nil {
		b.Fatal(err)
	}
	// The steady input: 50 orders every 100 ms.
	p, err := client.NewProducer(sb.c, job+"_input")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := uint64(0); ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := etl.Produce(ctx, sb.c, p, j.in, etl.SampleOrders(50, soCustomers, 100, i), nil); err != nil && ctx.Err() == nil {
				b.Errorf("input: %v", err)
				return
			}
		}
	})
	for i := range n {
		j.start(i)
	}
	for _, q := range route.SubscribeQueues() {
		j.tasks = append(j.tasks, scaleout.TaskID{Stage: etl.UIDSource, Broker: q.BrokerName, Queue: q.QueueID}.String())
	}
	keyedQueues, err := scaleout.KeyedLayout(ctx, sb.c, pipeline.DefaultRanges)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range keyedQueues.Queues(scaleout.TopicName(job, etl.UIDEnrich, scaleout.KindRepart)) {
		j.tasks = append(j.tasks, scaleout.TaskID{Stage: etl.UIDEnrich, Broker: q.BrokerName, Queue: q.QueueID}.String())
	}
	return j
}

// start (re)starts worker i on its state directory (a new one when i is
// past the last) and waits for its status address.
func (j *soSteadyJob) start(i int) {
	if i == len(j.workers) {
		j.workers, j.addrs = append(j.workers, nil), append(j.addrs, "")
	}
	name := fmt.Sprintf("w%d", i)
	cfg := soChildConfig{Role: "etl", Namesrv: j.sb.ns, Dir: filepath.Join(j.dir, name), Instance: j.job + "-" + name,
		Job: j.job, In: j.in, Out: j.out, DLQ: j.dlq, Interval: etl.DefaultInterval, Standbys: j.standbys}
	j.workers[i] = startSOProc(j.b, fmt.Sprintf("%s-w%d", j.job, i), cfg)
	j.addrs[i] = j.workers[i].line(j.b, soLineStatus, time.Minute)[0]
}

// settle is soSettle over the job's live workers.
func (j *soSteadyJob) settle(ctx context.Context) {
	soSettle(j.b, ctx, j.addrs, j.workers, j.tasks, j.standbys)
}

func runSOFailover(b *testing.B, sb *soBroker, seq, standbys, kills int, res *soFailoverResult) {
	b.Helper()
	job := fmt.Sprintf("so_fail_%d_s%d", seq, standbys)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	j := newSOSteadyJob(ctx, b, sb, &wg, job, 3, standbys)
	workers, addrs, tasks, out := j.workers, j.addrs, j.tasks, j.out
	start := j.start
	// The source tasks' commit chains, followed here as any worker does.
	fol := scaleout.NewFollower(sb.c, job, nil)
	defer fol.Close()
	for _, t := range tasks {
		id, err := scaleout.ParseTaskID(t)
		if err != nil {
			b.Fatal(err)
		}
		if id.Stage == etl.UIDSource {
			fol.Follow(t, protocol.MessageQueue{Topic: scaleout.TopicName(job, id.Stage, scaleout.KindCommit), BrokerName: id.Broker, QueueID: id.Queue})
		}
	}
	w := &soWatch{waits: map[string]*soWait{}}
	tailOutput(ctx, b, sb.c, out, w.output, &wg)
	rng := rand.New(rand.NewPCG(uint64(seq), uint64(standbys)))
	for k := range kills {
		soSettle(b, ctx, addrs, workers, tasks, standbys)
		time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Millisecond)
		v := k % len(workers)
		st, err := workerStatus(ctx, addrs[v])
		if err != nil {
			b.Fatal(err)
		}
		w.mu.Lock()
		w.waits = map[string]*soWait{}
		for _, t := range st.Tasks {
			id, err := scaleout.ParseTaskID(t.Task)
			if err != nil {
				b.Fatal(err)
			}
			w.waits[t.Task] = &soWait{owner: t.OwnerEpoch, chain: id.Stage == etl.UIDSource}
		}
		w.mu.Unlock()
		t0 := time.Now()
		workers[v].kill()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			changed := fol.Changed()
			w.mu.Lock()
			for t, wt := range w.waits {
				if !wt.chain || !wt.back.IsZero() {
					continue
				}
				if vw, err := fol.View(t); err == nil && vw.Latest != nil && vw.Latest.Kind == scaleout.KindCommitRecord && vw.Latest.OwnerEpoch > wt.owner {
					wt.back = time.UnixMilli(vw.Latest.TimeMs)
				}
			}
			w.mu.Unlock()
			if len(w.pending()) == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s kill %d of worker %d: tasks %v not back after 2 minutes\n%s", job, k+1, v, w.pending(), soDump(ctx, addrs, workers))
			}
			select {
			case <-changed:
			case <-time.After(20 * time.Millisecond):
			}
		}
		// Where the time went, from the new owners' status.
		var worst time.Duration
		w.mu.Lock()
		backs := map[string]time.Time{}
		for t, wt := range w.waits {
			backs[t] = wt.back
		}
		w.mu.Unlock()
		phases := map[string]*soPhase{}
		for i, a := range addrs {
			if i == v {
				continue
			}
			st, err := workerStatus(ctx, a)
			if err != nil {
				b.Fatal(err)
			}
			for _, t := range st.Tasks {
				if _, dead := backs[t.Task]; !dead {
					continue
				}
				ph := &soPhase{running: t.Since, reused: t.Restore != nil && t.Restore.Reused}
				if t.Restore != nil {
					ph.restore = t.Restore.Duration
				}
				for _, h := range st.Handoffs {
					if h.Task != t.Task || h.Time.Before(t0) {
						continue
					}
					switch h.Event {
					case "assigned":
						ph.assigned = h.Time
					case "claimed":
						ph.claimed = h.Time
					}
				}
				phases[t.Task] = ph
			}
		}
		for t, back := range backs {
			d := back.Sub(t0)
			res.task = append(res.task, d)
			worst = max(worst, d)
			if ph := phases[t]; ph != nil && !ph.assigned.IsZero() && !ph.claimed.IsZero() {
				res.detect = append(res.detect, ph.assigned.Sub(t0))
				res.claim = append(res.claim, ph.claimed.Sub(ph.assigned))
				res.restore = append(res.restore, ph.restore)
				res.output = append(res.output, back.Sub(ph.running))
				res.tasks++
				if ph.reused {
					res.reused++
				}
			}
		}
		res.all = append(res.all, worst)
		b.Logf("%s kill %d (worker %d, %d tasks): all back after %v", job, k+1, v, len(backs), worst.Round(time.Millisecond))
		start(v)
	}
	for _, p := range workers {
		p.stop(b, 2*time.Minute)
	}
}

type soPhase struct {
	assigned, claimed, running time.Time
	restore                    time.Duration
	reused                     bool
}

// soSettle waits until every task runs on exactly one live worker and,
// with standbys, every task has that many caught-up copies, then for one
// checkpoint interval more (every task's first checkpoint under its
// owner).
func soSettle(b *testing.B, ctx context.Context, addrs []string, workers []*soProc, tasks []string, standbys int) {
	b.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var why string
	for {
		sts, err := soStatuses(ctx, addrs, workers)
		if err == nil {
			why = soUnsettled(sts, tasks, standbys)
			if why == "" {
				time.Sleep(etl.DefaultInterval + 500*time.Millisecond)
				return
			}
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) {
			b.Fatalf("the workers did not settle within 3 minutes: %s\n%s", why, soDump(ctx, addrs, workers))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func soStatuses(ctx context.Context, addrs []string, workers []*soProc) ([]*pipeline.WorkerStatus, error) {
	sts := make([]*pipeline.WorkerStatus, len(addrs))
	for i, a := range addrs {
		if workers[i].exited() {
			return nil, fmt.Errorf("worker %s exited: %v\n%s", workers[i].name, workers[i].err, javapeer.Tail([]byte(workers[i].out.String()), 50))
		}
		st, err := workerStatus(ctx, a)
		if err != nil {
			return nil, err
		}
		sts[i] = st
	}
	return sts, nil
}

// soUnsettled says what keeps the workers from being settled ("" when
// they are).
func soUnsettled(sts []*pipeline.WorkerStatus, tasks []string, standbys int) string {
	owners := map[string]int{}
	copies := map[string]int{}
	for _, st := range sts {
		for _, t := range st.Tasks {
			if t.State != "running" {
				return fmt.Sprintf("task %s is %s on %s", t.Task, t.State, st.Worker)
			}
			owners[t.Task]++
		}
		for _, s := range st.Standbys {
			if s.Lag == 0 && s.At > 0 {
				copies[s.Task]++
			}
		}
	}
	for _, t := range tasks {
		if owners[t] != 1 {
			return fmt.Sprintf("task %s runs on %d workers", t, owners[t])
		}
		if copies[t] < standbys {
			return fmt.Sprintf("task %s has %d caught-up standbys", t, copies[t])
		}
	}
	return ""
}

// soDump is the workers' status and log tails, for a failure message.
func soDump(ctx context.Context, addrs []string, workers []*soProc) string {
	var sb strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&sb, "== %s (%s)\n", workers[i].name, a)
		if st, err := workerStatus(ctx, a); err == nil {
			for _, t := range st.Tasks {
				fmt.Fprintf(&sb, "  task %s %s owner %d %s\n", t.Task, t.State, t.OwnerEpoch, t.LastError)
			}
			for _, s := range st.Standbys {
				fmt.Fprintf(&sb, "  standby %s at %d latest %d\n", s.Task, s.At, s.Latest)
			}
		} else if !errors.Is(err, context.Canceled) {
			fmt.Fprintf(&sb, "  status: %v\n", err)
		}
		n := 25 // lines
		if os.Getenv(envSODebug) != "" {
			n = 1 << 30
		}
		sb.WriteString(javapeer.Tail([]byte(workers[i].out.String()), n))
		sb.WriteString("\n")
	}
	return sb.String()
}
