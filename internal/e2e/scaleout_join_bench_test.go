package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/scaleout"
)

// BenchmarkScaleoutJoin measures what a joining worker costs the workers
// already running: examples/etl's job runs as two worker processes under a
// steady 500 orders/s; once every task runs, a third worker starts, the
// rebalance moves some tasks to it (sticky: the others stay) and the
// benchmark watches the output of every keyed task (the stage that writes
// the output topic) until the three have settled and one more checkpoint
// interval (1 s) passed.
//
// A keyed task's gap is the longest time between two consecutive output
// batches of it (output becomes visible per checkpoint, so a second is the
// floor). base-gap-ms is the longest gap of any keyed task in the 5 s
// before the join; stay-gap-ms the longest gap during the join of a keyed
// task that stayed on its worker (it still stalls while the source tasks
// that feed it move, as every source queue feeds every range);
// move-handoff-ms the longest time from the join to a moved keyed task's
// first output under its new owner. The bound is that a join
// stalls the others no longer than one hand-off: stay-gap-ms against
// move-handoff-ms. moved is the number of tasks (of 16) that moved.
func BenchmarkScaleoutJoin(b *testing.B) {
	sb := startSOBroker(b)
	var base, stay, handoff []time.Duration
	moved := 0
	for i := range b.N {
		r := runSOJoin(b, sb, i)
		base, stay, handoff = append(base, r.base), append(stay, r.stay), append(handoff, r.handoff)
		moved += r.moved
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(percentile(base, 50)), "base-gap-ms")
	b.ReportMetric(ms(percentile(stay, 50)), "stay-gap-ms")
	b.ReportMetric(ms(percentile(handoff, 50)), "move-handoff-ms")
	b.ReportMetric(float64(moved)/float64(b.N), "moved")
}

type soJoinResult struct {
	base, stay, handoff time.Duration
	moved               int
}

// soGaps keeps, per task, when its output was last seen and its longest
// gap since the last reset, and the first time a task's output came from
// an owner epoch above a threshold.
type soGaps struct {
	mu    sync.Mutex
	last  map[string]time.Time
	gap   map[string]time.Duration
	above map[string]uint64    // task -> epoch its new owner's output must exceed
	first map[string]time.Time // task -> first output above that epoch
}

// seen records one output record (tailOutput's callback). Records read in
// one pull share their time: a batch.
func (g *soGaps) seen(task string, owner uint64, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if l, ok := g.last[task]; ok {
		g.gap[task] = max(g.gap[task], at.Sub(l))
	}
	g.last[task] = at
	if e, ok := g.above[task]; ok && owner > e {
		if _, done := g.first[task]; !done {
			g.first[task] = at
		}
	}
}

// reset starts new gaps from now, and returns the longest of those that
// ended (each task's gap including the open one up to now).
func (g *soGaps) reset(tasks []string) map[string]time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	out := map[string]time.Duration{}
	for _, t := range tasks {
		d := g.gap[t]
		if l, ok := g.last[t]; ok {
			d = max(d, now.Sub(l))
		}
		out[t] = d
		g.gap[t] = 0
	}
	return out
}

func runSOJoin(b *testing.B, sb *soBroker, seq int) soJoinResult {
	b.Helper()
	job := fmt.Sprintf("so_join_%d", seq)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	j := newSOSteadyJob(ctx, b, sb, &wg, job, 2, 0)
	var keyed []string
	for _, t := range j.tasks {
		if id, err := scaleout.ParseTaskID(t); err == nil && id.Stage == etl.UIDEnrich {
			keyed = append(keyed, t)
		}
	}
	g := &soGaps{last: map[string]time.Time{}, gap: map[string]time.Duration{}, above: map[string]uint64{}, first: map[string]time.Time{}}
	tailOutput(ctx, b, sb.c, j.out, g.seen, &wg)
	j.settle(ctx)
	g.reset(keyed)
	time.Sleep(5 * time.Second)
	var r soJoinResult
	for _, d := range g.reset(keyed) {
		r.base = max(r.base, d)
	}
	// The owner epochs before the join: a moved task's output under its
	// new owner carries a higher one.
	g.mu.Lock()
	for _, a := range j.addrs {
		st, err := workerStatus(ctx, a)
		if err != nil {
			g.mu.Unlock()
			b.Fatal(err)
		}
		for _, t := range st.Tasks {
			if t.State == "running" {
				g.above[t.Task] = t.OwnerEpoch
			}
		}
	}
	g.mu.Unlock()
	t0 := time.Now()
	j.start(2)
	j.settle(ctx)
	gaps := g.reset(keyed)
	st, err := workerStatus(ctx, j.addrs[2])
	if err != nil {
		b.Fatal(err)
	}
	var movedKeyed []string
	for _, t := range st.Tasks {
		if t.State != "running" {
			continue
		}
		r.moved++
		if slices.Contains(keyed, t.Task) {
			movedKeyed = append(movedKeyed, t.Task)
		}
	}
	for _, t := range keyed {
		if !slices.Contains(movedKeyed, t) {
			r.stay = max(r.stay, gaps[t])
		}
	}
	g.mu.Lock()
	for _, t := range movedKeyed {
		f, ok := g.first[t]
		if !ok {
			g.mu.Unlock()
			b.Fatalf("%s: moved task %s has no output under its new owner after the workers settled", job, t)
		}
		r.handoff = max(r.handoff, f.Sub(t0))
	}
	g.mu.Unlock()
	b.Logf("%s: %d tasks moved (%d keyed); longest gap before %v, of a staying keyed task during the join %v; moved keyed tasks back after %v",
		job, r.moved, len(movedKeyed), r.base.Round(time.Millisecond), r.stay.Round(time.Millisecond), r.handoff.Round(time.Millisecond))
	for _, p := range j.workers {
		p.stop(b, 2*time.Minute)
	}
	return r
}
