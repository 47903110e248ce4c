package pipeline

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/runnel-dev/runnel/source"
)

// Split discovery: sources implementing source.Discoverer are asked for
// their current splits every DiscoveryInterval (and on Job.DiscoverNow),
// between checkpoints; each split not seen before gets a source task wired
// to the running downstream tasks. The engine adds it only while no task
// has finished and the job is not stopping, so every receiver is still
// reading, and before the next checkpoint is triggered, so the new task
// takes part in (and its offset is stored by) every later checkpoint. A
// receiver learns of the new sender from its inbox before it aligns the
// next barrier, so no barrier completes without the new sender's.

// DefaultDiscoveryInterval is how often sources that implement
// source.Discoverer are asked for new splits while the job runs.
const DefaultDiscoveryInterval = 30 * time.Second

// DiscoveryInterval sets how often sources implementing source.Discoverer
// are asked for new splits while the job runs (default
// DefaultDiscoveryInterval; 0 disables the periodic discovery, leaving
// Job.DiscoverNow). A new split gets its own source task, starting where the
// source says a split without a checkpoint starts.
func DiscoveryInterval(d time.Duration) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.discoveryInterval = d })
}

// DiscoverNow asks the running job to look for new source splits as soon as
// no checkpoint is in flight (a no-op before Run). It does not block; it is
// safe for concurrent use.
func (j *Job) DiscoverNow() {
	if eng := j.engine.Load(); eng != nil {
		eng.DiscoverNow()
	}
}

// enableDiscovery registers the discovery callback when some source can
// discover splits.
func (r *jobRun) enableDiscovery() {
	var srcs []*node
	for _, n := range r.job.nodes {
		if n.discover != nil {
			srcs = append(srcs, n)
		}
	}
	if len(srcs) == 0 {
		return
	}
	r.engine.OnDiscover(func(ctx context.Context) error {
		for _, n := range srcs {
			if err := n.discover(ctx, r); err != nil {
				return fmt.Errorf("pipeline: source %q: %w", n.uid, err)
			}
		}
		return nil
	})
}

// discoverSplits is a source node's discover function: it asks d for the
// current splits and adds a task for each one not in *splits. Failures to
// list splits are transient (logged, retried at the next discovery); a
// failure to start a task is fatal.
func discoverSplits(n *node, d source.Discoverer, splits *[]source.Split) func(ctx context.Context, r *jobRun) error {
	return func(ctx context.Context, r *jobRun) error {
		found, err := d.DiscoverSplits(ctx)
		if err != nil {
			r.engine.Logger().Warn("split discovery failed; retried at the next discovery", "source", n.uid, "err", err)
			return nil
		}
		known := make(map[string]bool, len(*splits))
		for _, s := range *splits {
			known[s.ID] = true
		}
		for _, s := range found {
			if known[s.ID] {
				continue
			}
			known[s.ID] = true
			*splits = append(*splits, s)
			r.engine.Logger().Info("new split discovered", "source", n.uid, "split", s.ID)
			if err := r.addTask(n, len(*splits)-1); err != nil {
				return fmt.Errorf("split %s: %w", s.ID, err)
			}
		}
		return nil
	}
}

// addTask adds a source task for split index subtask of n to the running
// job: it becomes a new sender of every exchange node it reaches.
func (r *jobRun) addTask(n *node, subtask int) error {
	t := &taskInfo{idx: len(r.tasks), node: n, subtask: subtask}
	targets := reachable(n, make(map[*node]bool), r.remote)
	for _, x := range targets {
		if x.addSender == nil {
			return fmt.Errorf("pipeline: internal: operator %q cannot take a new input", x.uid)
		}
	}
	r.tasks = append(r.tasks, t)
	for _, x := range targets {
		r.senderIdx[[2]int{t.idx, x.id}] = x.senders
		x.senders++
		x.addSender()
	}
	return n.startTask(r, t)
}

// addSender gives the inbox a queue for one more sender (index: the old
// count). Senders and the receiver may be running.
func (in *inbox[R]) addSender() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.mu.q = append(in.mu.q, ring[R]{buf: make([]message[R], queueLen)})
	in.mu.blocked = append(in.mu.blocked, false)
	in.space = append(in.space[:len(in.space):len(in.space)], make(chan struct{}, 1))
}

// senderCount returns the number of senders the inbox has now.
func (in *inbox[R]) senderCount() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.mu.q)
}

// grow adds senders up to n (a sender added while the task runs): they have
// delivered no barrier yet.
func (a *aligner) grow(n int) {
	for len(a.lastSeen) < n {
		a.lastSeen = append(a.lastSeen, 0)
		a.eos = append(a.eos, false)
		a.live++
	}
}

// grow adds senders up to n with no watermark yet: a new split holds the
// combined watermark back until it reports its own (or goes idle).
func (w *inputWatermarks) grow(n int) {
	for len(w.wms) < n {
		w.wms = append(w.wms, math.MinInt64)
		w.idle = append(w.idle, false)
	}
}
