package pipeline

import (
	"context"
	"fmt"

	"github.com/runnel-dev/runnel/runtime"
)

// jobRun is one execution of a Job: its tasks and their wiring.
type jobRun struct {
	job       *Job
	engine    *runtime.Engine
	tasks     []*taskInfo
	senderIdx map[[2]int]int // (task index, exchange node id) -> sender index
	hooks     *runHooks      // hooks.go
	scope     *taskScope     // scale-out: the task this run is (scope.go); nil otherwise
}

// taskInfo is one task to run: a source split, a keyed subtask or a sink.
type taskInfo struct {
	idx     int
	node    *node
	subtask int // split index for sources, subtask for keyed operators
	// repart marks a scale-out keyed stage's input task: it reads the
	// stage's repartition queue and feeds node (scope.go).
	repart bool
}

// port is a task's output towards one exchange node (a keyed operator's
// subtasks or a sink). Data goes through the typed emitFn returned by the
// node's buildInput; the task drives the port's control messages.
type port interface {
	flush(ctx context.Context) error
	barrier(ctx context.Context, id uint64, stop bool) error
	watermark(ctx context.Context, wm int64) error
	end(ctx context.Context) error
}

// plan enumerates the tasks, counts the senders of every exchange node,
// creates the inboxes and registers every task on the engine.
func (r *jobRun) plan(ctx context.Context) error {
	j := r.job
	for _, n := range j.nodes {
		if n.taskCount == nil {
			continue
		}
		cnt, err := r.countTasks(ctx, n) // startup.go: waits for unavailable sources
		if err != nil {
			return fmt.Errorf("pipeline: operator %q: %w", n.uid, err)
		}
		for i := range cnt {
			r.tasks = append(r.tasks, &taskInfo{idx: len(r.tasks), node: n, subtask: i})
		}
	}
	if sc := r.scope; sc != nil && sc.head.exchange {
		r.tasks = append(r.tasks, &taskInfo{idx: len(r.tasks), node: sc.head, repart: true})
	}
	for _, t := range r.tasks {
		var targets []*node
		if t.repart {
			targets = []*node{t.node}
		} else {
			targets = reachable(t.node, make(map[*node]bool), r.remote)
		}
		for _, x := range targets {
			r.senderIdx[[2]int{t.idx, x.id}] = x.senders
			x.senders++
		}
	}
	for _, n := range j.nodes {
		n.stats = r.engine.Operator(n.uid, n.kind)
		if n.exchange && n.senders == 0 {
			if !r.inScope(n) || r.remote(n) {
				continue // another task's part of the graph
			}
			return fmt.Errorf("%w: operator %q has no input", ErrInvalidGraph, n.uid)
		}
		if n.setup != nil {
			if err := n.setup(r); err != nil {
				return err
			}
		}
	}
	for _, n := range j.nodes {
		if n.restore != nil && r.inScope(n) {
			if err := n.restore(ctx, r); err != nil {
				return fmt.Errorf("pipeline: restore %q: %w", n.uid, err)
			}
		}
	}
	for _, t := range r.tasks {
		start := t.node.startTask
		if t.repart {
			start = t.node.startRepart
		}
		if err := start(r, t); err != nil {
			return fmt.Errorf("pipeline: operator %q task %d: %w", t.node.uid, t.subtask, err)
		}
	}
	if r.scope == nil {
		r.enableDiscovery() // discovery.go; scale-out tasks gain queues by rebalance
	}
	return nil
}

// reachable returns the exchange nodes a task headed by head sends to:
// through its chained operators, side outputs and dead-letter policies.
// Nodes for which remote reports true (another scale-out stage's head) are
// not among them: the task writes to their repartition topic instead.
func reachable(head *node, seen map[*node]bool, remote func(*node) bool) []*node {
	var out []*node
	var walk func(n *node)
	add := func(x *node) {
		if x != nil && !seen[x] && !remote(x) {
			seen[x] = true
			out = append(out, x)
		}
	}
	walk = func(n *node) {
		add(n.job.dlqNode(n.policy))
		for _, c := range append(append([]*node(nil), n.outs...), n.sides...) {
			if c.exchange {
				add(c)
			} else if !seen[c] {
				seen[c] = true
				walk(c)
			}
		}
	}
	if head.kind == kindSink {
		return nil
	}
	walk(head)
	return out
}

// counter accumulates a node's record counts in one task, flushed to the
// shared atomic stats once per batch.
type counter struct {
	stats                   *runtime.OperatorStats
	in, out, rejected, late int64
}

func (c *counter) flush() {
	if c.in != 0 {
		c.stats.In.Add(c.in)
		c.in = 0
	}
	if c.out != 0 {
		c.stats.Out.Add(c.out)
		c.out = 0
	}
	if c.rejected != 0 {
		c.stats.Errors.Add(c.rejected)
		c.rejected = 0
	}
	if c.late != 0 {
		c.stats.Late.Add(c.late)
		c.late = 0
	}
}

// recMeta is the origin of the record a source task is processing, for dead
// letters.
type recMeta struct {
	source, split string
	offset, raw   []byte
	trace         runtime.RecordTrace // nil when the record is not traced (hooks.go)
}

// chainBuilder builds one task's chain of operators.
type chainBuilder struct {
	r        *jobRun
	task     *taskInfo
	memo     map[*node]any
	ports    []port
	counters []*counter
	meta     recMeta
}

func newChainBuilder(r *jobRun, t *taskInfo) *chainBuilder {
	return &chainBuilder{r: r, task: t, memo: make(map[*node]any)}
}

// input returns node n's input for this task (memoised, so diamonds share
// one port per exchange).
func (b *chainBuilder) input(n *node) (any, error) {
	if in, ok := b.memo[n]; ok {
		return in, nil
	}
	in, err := n.buildInput(b)
	if err != nil {
		return nil, err
	}
	b.memo[n] = in
	return in, nil
}

// sender returns this task's sender index at exchange node n.
func (b *chainBuilder) sender(n *node) (int, error) {
	s, ok := b.r.senderIdx[[2]int{b.task.idx, n.id}]
	if !ok {
		return 0, fmt.Errorf("pipeline: internal: task %d is not a sender of %q", b.task.idx, n.uid)
	}
	return s, nil
}

func (b *chainBuilder) addPort(p port) { b.ports = append(b.ports, p) }

func (b *chainBuilder) counter(n *node) *counter {
	c := &counter{stats: n.stats}
	b.counters = append(b.counters, c)
	return c
}

func (b *chainBuilder) flushCounters() {
	for _, c := range b.counters {
		c.flush()
	}
}

// rejecter returns the handler of records that node n's function failed on.
func (b *chainBuilder) rejecter(n *node) func(ctx context.Context, err error, v any, ts int64) error {
	return b.rejecterFor(n, n.uid, n.policy)
}

func (b *chainBuilder) rejecterFor(n *node, operator string, p Policy) func(ctx context.Context, err error, v any, ts int64) error {
	c := b.counter(n)
	switch p.kind {
	case policySkip:
		hooks, fromSource := b.r.hooks, n.kind == kindSource
		return func(_ context.Context, err error, _ any, _ int64) error {
			c.rejected++
			reason := reasonOf(err, fromSource) // reasons.go
			hooks.onDeadLetter(operator, reason, "skip")
			recordDeadLetter(b.r.engine, operator, "skip", reason, err) // statusgraph.go
			return nil
		}
	case policyDeadLetter:
		send := b.deadLetterer(n, operator, p) // reasons.go
		return func(ctx context.Context, err error, v any, ts int64) error {
			c.rejected++
			return send(ctx, err, v, ts)
		}
	default:
		return func(_ context.Context, err error, _ any, _ int64) error {
			return fmt.Errorf("operator %q: %w", operator, err)
		}
	}
}

// Port helpers used by every task.

func flushPorts(ctx context.Context, ps []port) error {
	for _, p := range ps {
		if err := p.flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

// syncer is a port whose output must be acknowledged by a broker before
// its task acknowledges a checkpoint (a scale-out repartition port).
type syncer interface {
	sync(ctx context.Context) error
}

// syncPorts waits, before a checkpoint acknowledgement, until every port's
// output is durable.
func syncPorts(ctx context.Context, ps []port) error {
	for _, p := range ps {
		if s, ok := p.(syncer); ok {
			if err := s.sync(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func barrierPorts(ctx context.Context, ps []port, id uint64, stop bool) error {
	for _, p := range ps {
		if err := p.barrier(ctx, id, stop); err != nil {
			return err
		}
	}
	return nil
}

func watermarkPorts(ctx context.Context, ps []port, wm int64) error {
	for _, p := range ps {
		if err := p.watermark(ctx, wm); err != nil {
			return err
		}
	}
	return nil
}

func endPorts(ctx context.Context, ps []port) error {
	for _, p := range ps {
		if err := p.end(ctx); err != nil {
			return err
		}
	}
	return nil
}

// finishedLoop is where a task waits after its input ended or it passed a
// stop barrier: it answers checkpoint triggers with cp's snapshot (of its
// now quiescent state), hands cp the notes, and returns when the job
// closes.
func finishedLoop(ctx context.Context, h *runtime.Handle, cp checkpointed) error {
	h.Finish()
	var notes []runtime.Note
	for {
		// Notes are queued before closing is set: read closing first, then
		// drain, and nothing is lost.
		closing := h.Closing()
		notes = h.Notes(notes[:0])
		for _, n := range notes {
			if err := cp.note(ctx, n); err != nil {
				return err
			}
		}
		if id, _, ok := h.Trigger(); ok {
			a, err := cp.snapshot(ctx, id)
			if err != nil {
				return err
			}
			h.Ack(id, a)
			continue
		}
		if closing {
			return nil
		}
		select {
		case <-h.Wake():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
