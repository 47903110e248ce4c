package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Scale-out defaults.
const (
	// DefaultRanges is the number of key-group ranges (tasks) of a keyed
	// stage of a job running on many workers: at most this many workers
	// share the stage.
	DefaultRanges = 8
)

// ErrWorkerFingerprint is returned by RunWorker when the running job's
// commit chains were written by a job whose checkpoint fingerprint differs
// (other operator UIDs, key groups or codecs): this worker refuses to take
// any of its tasks.
var ErrWorkerFingerprint = errors.New("pipeline: the running job has another fingerprint")

// Ranges sets the number of key-group ranges (tasks) of every keyed stage of
// a job run with RunWorker (default DefaultRanges; at most
// MaxParallelism). It is part of the job's layout: every worker must use
// the same.
func Ranges(n int) JobOption { return jobOptionFunc(func(c *jobConfig) { c.ranges = n }) }

// WorkerGroup names the consumer group the workers of a job run with
// RunWorker join (default "runnel_" + the job's name). Every worker of one
// job must use the same.
func WorkerGroup(g string) JobOption { return jobOptionFunc(func(c *jobConfig) { c.workerGroup = g }) }

// SnapshotEvery sets how many checkpoints of a task may follow its latest
// snapshot in the broker before the next is written (RunWorker; default
// 64): a restore on another worker reads the snapshot and at most this many
// checkpoints' changes.
func SnapshotEvery(n int) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.snapshotEvery = n })
}

// RunWorker runs one worker process of the job name, which runs as many
// processes as are started, on as many machines, with RocketMQ itself as
// the distributed engine (see internal/scaleout's package documentation
// for the protocol). build adds the job's graph to a Job; RunWorker calls it
// once to learn the graph, then once for every task this worker gains,
// so it must create the sources and sinks it adds (each task gets its
// own). Every source must be a RocketMQ source (source/rocketmq); the job's
// state directory (CheckpointDir) is this worker's own.
//
// The worker joins the job's consumer group (WorkerGroup) subscribed to the
// source topics and to the job's repartition topics, creating the job's
// topics on first use. Each queue RocketMQ's rebalance assigns it (and
// whose broker lock it holds) is a task: it claims the task's commit chain,
// restores the task's state (from its own disk when that is current, else
// from the broker), and runs the task as a job of its own until the queue
// is revoked (then it takes a final checkpoint) or its lock is lost (then
// it stops before its next commit). Tasks whose run fails are claimed and
// run again while they stay assigned.
//
// RunWorker returns when ctx is cancelled (after every task stopped with a
// final checkpoint, its queues handed back) or on an error that leaves the
// worker unable to take part: ErrWorkerFingerprint, a graph that cannot be
// distributed, an unreachable cluster.
func RunWorker(ctx context.Context, c *client.Client, name string, build func(*Job) error, opts ...JobOption) error {
	w, err := newWorker(ctx, c, name, build, opts)
	if err != nil {
		return err
	}
	return w.run(ctx)
}

// stageInfo is one stage of a distributed job.
type stageInfo struct {
	head    string // UID of the head operator
	keyed   bool
	input   string // the topic whose queues are the stage's tasks
	layout  scaleout.Layout
	commit  string
	change  string
	origins []string // keyed: the tasks of the stages feeding it
}

type worker struct {
	c      *client.Client
	name   string
	build  func(*Job) error
	opts   []JobOption
	cfg    jobConfig
	log    *slog.Logger
	group  string
	fp     checkpoint.Fingerprint
	fpHash [32]byte
	stages map[string]*stageInfo // by head UID
	byIn   map[string]*stageInfo // by input topic

	producer *client.Producer
	follower *scaleout.Follower
	gc       *client.GroupConsumer
	wg       sync.WaitGroup

	mu struct {
		sync.Mutex
		tasks map[protocol.MessageQueue]*taskRun
	}
}

// taskRun is one task this worker owns.
type taskRun struct {
	q      protocol.MessageQueue
	stage  *stageInfo
	id     scaleout.TaskID
	cancel context.CancelFunc
	done   chan struct{}
	// lost is set when the queue's lock was lost: the task must not
	// publish another checkpoint.
	lost chan struct{}
	once sync.Once
}

func newWorker(ctx context.Context, c *client.Client, name string, build func(*Job) error, opts []JobOption) (*worker, error) {
	tmpl := New(name, opts...)
	if err := build(tmpl); err != nil {
		return nil, fmt.Errorf("pipeline: build %s: %w", name, err)
	}
	if err := tmpl.validate(); err != nil {
		return nil, err
	}
	cfg := tmpl.cfg
	if cfg.dir == "" {
		return nil, fmt.Errorf("%w: RunWorker needs a state directory (CheckpointDir)", ErrInvalidGraph)
	}
	if cfg.ranges == 0 {
		cfg.ranges = DefaultRanges
	}
	if cfg.ranges < 1 || cfg.ranges > cfg.maxParallelism {
		return nil, fmt.Errorf("%w: %d ranges outside [1, max parallelism %d]", ErrInvalidGraph, cfg.ranges, cfg.maxParallelism)
	}
	w := &worker{c: c, name: name, build: build, opts: opts, cfg: cfg, log: cfg.logger,
		stages: map[string]*stageInfo{}, byIn: map[string]*stageInfo{}}
	w.group = cfg.workerGroup
	if w.group == "" {
		w.group = scaleout.GroupName(name)
	}
	w.fp = tmpl.fingerprint()
	fb, err := json.Marshal(struct {
		FP     checkpoint.Fingerprint
		Ranges int
	}{w.fp, cfg.ranges})
	if err != nil {
		return nil, err
	}
	w.fpHash = sha256.Sum256(fb)
	if err := w.plan(ctx, tmpl); err != nil {
		return nil, err
	}
	return w, nil
}

// plan finds the job's stages and their layouts and makes sure the job's
// topics exist.
func (w *worker) plan(ctx context.Context, tmpl *Job) error {
	heads := tmpl.stageHeads()
	for _, h := range heads {
		st := &stageInfo{head: h.uid, keyed: h.kind != kindSource}
		if st.keyed {
			l, err := scaleout.KeyedLayout(ctx, w.c, w.cfg.ranges)
			if err != nil {
				return err
			}
			st.layout, st.input = l, scaleout.TopicName(w.name, h.uid, scaleout.KindRepart)
		} else {
			ts, ok := h.src.(interface{ Topic() string })
			if !ok {
				return fmt.Errorf("%w: source %q is not a RocketMQ source: a job on many workers reads RocketMQ queues", ErrInvalidGraph, h.uid)
			}
			st.input = ts.Topic()
			l, err := scaleout.SourceLayout(ctx, w.c, st.input)
			if err != nil {
				return err
			}
			st.layout = l
		}
		if w.byIn[st.input] != nil {
			return fmt.Errorf("%w: two stages read topic %s", ErrInvalidGraph, st.input)
		}
		st.commit = scaleout.TopicName(w.name, h.uid, scaleout.KindCommit)
		st.change = scaleout.TopicName(w.name, h.uid, scaleout.KindChangelog)
		w.stages[h.uid], w.byIn[st.input] = st, st
	}
	// The origins of a keyed stage: the tasks of every stage with an edge
	// into its head.
	for _, h := range heads {
		for n := range stageNodes(h) {
			for _, o := range n.outs {
				if o != h && isStageHead(o) && o.kind != kindSource {
					up := w.stages[h.uid]
					for _, q := range up.layout.Queues(up.input) {
						w.stages[o.uid].origins = append(w.stages[o.uid].origins, taskOf(up, q).String())
					}
				}
			}
		}
	}
	for _, st := range w.stages {
		kinds := []string{scaleout.KindCommit, scaleout.KindChangelog}
		if st.keyed {
			kinds = append(kinds, scaleout.KindRepart)
		}
		if err := scaleout.EnsureTopics(ctx, w.c, w.name, st.head, st.layout, kinds...); err != nil {
			return err
		}
	}
	return nil
}

func taskOf(st *stageInfo, q protocol.MessageQueue) scaleout.TaskID {
	return scaleout.TaskID{Stage: st.head, Broker: q.BrokerName, Queue: q.QueueID}
}

func (st *stageInfo) taskLog(id scaleout.TaskID) scaleout.TaskLog {
	return scaleout.TaskLog{Task: id.String(),
		CommitTopic: st.commit, Commit: protocol.MessageQueue{Topic: st.commit, BrokerName: id.Broker, QueueID: id.Queue},
		ChangelogTopic: st.change, Changelog: protocol.MessageQueue{Topic: st.change, BrokerName: id.Broker, QueueID: id.Queue}}
}

func (w *worker) run(ctx context.Context) (err error) {
	w.mu.tasks = map[protocol.MessageQueue]*taskRun{}
	p, err := client.NewProducer(w.c, w.group+"_worker")
	if err != nil {
		return err
	}
	w.producer = p
	defer func() { err = errors.Join(err, p.Close()) }()
	w.follower = scaleout.NewFollower(w.c, w.group, w.log)
	defer func() { _ = w.follower.Close() }()
	for _, st := range w.stages {
		for _, q := range st.layout.Queues(st.input) {
			id := taskOf(st, q)
			w.follower.Follow(id.String(), st.taskLog(id).Commit)
		}
	}
	if err := w.checkFingerprint(ctx); err != nil {
		return err
	}
	gc, err := client.NewGroupConsumer(w.c, w.group, client.WithAllocator(scaleout.Sticky()),
		client.WithQueueLocking(true), client.WithListener(w))
	if err != nil {
		return err
	}
	w.gc = gc
	for _, st := range w.stages {
		if err := gc.Subscribe(st.input, "*"); err != nil {
			return errors.Join(err, gc.Close())
		}
	}
	if err := gc.Start(ctx); err != nil {
		return errors.Join(err, gc.Close())
	}
	w.log.Info("worker started", "job", w.name, "group", w.group, "stages", len(w.stages))
	<-ctx.Done()
	// Close revokes every queue (OnRevoke stops its task with a final
	// checkpoint) before unlocking them.
	cerr := gc.Close()
	w.wg.Wait()
	return cerr
}

// checkFingerprint refuses to start when any task's latest record was
// written by a job with another fingerprint.
func (w *worker) checkFingerprint(ctx context.Context) error {
	for _, st := range w.stages {
		for _, q := range st.layout.Queues(st.input) {
			id := taskOf(st, q).String()
			if err := w.follower.Ready(ctx, id); err != nil {
				return err
			}
			v, err := w.follower.View(id)
			if err != nil {
				return err
			}
			if v.Latest != nil && v.Latest.Fingerprint != w.fpHash {
				return fmt.Errorf("%w: task %s's latest checkpoint %d was written by worker %s; this worker's operators, key groups, ranges or codecs differ: stop the other workers or run the same build", ErrWorkerFingerprint, id, v.Latest.Seq, v.Latest.Worker)
			}
		}
	}
	return nil
}

// OnAssign starts a task for every queue gained.
func (w *worker) OnAssign(_ context.Context, qs []protocol.MessageQueue) {
	for _, q := range qs {
		st := w.byIn[q.Topic]
		if st == nil {
			continue
		}
		w.mu.Lock()
		if w.mu.tasks[q] != nil {
			w.mu.Unlock()
			continue
		}
		tctx, cancel := context.WithCancel(context.Background())
		tr := &taskRun{q: q, stage: st, id: taskOf(st, q), cancel: cancel, done: make(chan struct{}), lost: make(chan struct{})}
		w.mu.tasks[q] = tr
		w.mu.Unlock()
		w.wg.Go(func() {
			defer close(tr.done)
			w.runTask(tctx, tr)
		})
	}
}

// stopTimeout bounds a task's final checkpoint on revocation.
const stopTimeout = 30 * time.Second

// OnRevoke stops the queues' tasks, each with a final checkpoint, before
// the group hands the queues back.
func (w *worker) OnRevoke(_ context.Context, qs []protocol.MessageQueue) {
	var stopping []*taskRun
	w.mu.Lock()
	for _, q := range qs {
		if tr := w.mu.tasks[q]; tr != nil {
			delete(w.mu.tasks, q)
			stopping = append(stopping, tr)
		}
	}
	w.mu.Unlock()
	for _, tr := range stopping {
		tr.cancel()
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	for _, tr := range stopping {
		select {
		case <-tr.done:
		case <-t.C:
			w.log.Warn("task did not stop in time; its lock is released anyway (the chain fences it)", "task", tr.id.String())
			tr.once.Do(func() { close(tr.lost) })
		}
	}
}

// OnLockLost fences the queues' tasks at once: they publish nothing more.
func (w *worker) OnLockLost(_ context.Context, qs []protocol.MessageQueue) {
	w.mu.Lock()
	var lost []*taskRun
	for _, q := range qs {
		if tr := w.mu.tasks[q]; tr != nil {
			delete(w.mu.tasks, q)
			lost = append(lost, tr)
		}
	}
	w.mu.Unlock()
	for _, tr := range lost {
		w.log.Warn("queue lock lost: stopping its task before its next commit", "task", tr.id.String())
		tr.once.Do(func() { close(tr.lost) })
		tr.cancel()
	}
}

// runTask runs a task until its ctx ends, claiming and running it again
// after a failure.
func (w *worker) runTask(ctx context.Context, tr *taskRun) {
	bo := backoff.Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := w.runTaskOnce(ctx, tr)
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				w.log.Warn("task stopped", "task", tr.id.String(), "err", err)
			}
			return
		}
		if errors.Is(err, scaleout.ErrFingerprint) || errors.Is(err, scaleout.ErrStaleLocalState) {
			w.log.Error("task cannot run on this worker", "task", tr.id.String(), "err", err)
		} else {
			w.log.Warn("task failed; claiming it again", "task", tr.id.String(), "err", err)
		}
		if backoff.Sleep(ctx, bo.Delay(attempt)) != nil {
			return
		}
	}
}

func (w *worker) runTaskOnce(ctx context.Context, tr *taskRun) error {
	st, id := tr.stage, tr.id
	tl := st.taskLog(id)
	cfg := scaleout.WriterConfig{Client: w.c, Producer: w.producer, Follower: w.follower, Group: w.group, Log: tl,
		Worker: w.c.ClientID(), Fingerprint: w.fpHash, SnapshotEvery: w.cfg.snapshotEvery, Logger: w.log}
	wr, base, err := scaleout.Claim(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = wr.Close() }()
	v, err := w.follower.View(tl.Task)
	if err != nil {
		return err
	}
	dir := filepath.Join(w.cfg.dir, "tasks", id.Dir())
	rep, err := scaleout.Restore(ctx, w.c, w.group, tl, dir, base, v, checkpoint.Options{Fingerprint: w.fp, Logger: w.log})
	if err != nil {
		return err
	}
	w.log.Info("task restored", "task", tl.Task, "owner epoch", wr.OwnerEpoch(), "reused", rep.Reused, "snapshot", rep.FromSnapshot,
		"segments", rep.Applied, "bytes", rep.Bytes)
	opts := append(append([]JobOption(nil), w.opts...), CheckpointDir(dir), jobOptionFunc(func(c *jobConfig) {
		c.statusAddr, c.onStatusAddr = "", nil
		c.obs.metricsAddr, c.obs.onMetricsAddr = "", nil
	}))
	j := New(w.name, opts...)
	if err := w.build(j); err != nil {
		return fmt.Errorf("pipeline: build %s for task %s: %w", w.name, tl.Task, err)
	}
	head := j.uids[st.head]
	if head == nil {
		return fmt.Errorf("%w: the build has no operator %q", ErrInvalidGraph, st.head)
	}
	sc := &taskScope{head: head, local: stageNodes(head), task: tl.Task, owner: wr.OwnerEpoch(), origins: st.origins,
		io: &scaleIO{client: w.c, producer: w.producer, group: w.group, dec: w.follower, repart: w.repartOf}}
	if st.keyed {
		queues := st.layout.Queues(st.input)
		r := indexOf(queues, tr.q)
		if r < 0 {
			return fmt.Errorf("pipeline: queue %s is not in %s's layout", tr.q, st.head)
		}
		sc.kgStart, sc.kgEnd = keyGroupRangeOf(w.cfg.maxParallelism, len(queues), r)
		sc.io.input = tr.q
	} else {
		sc.split = tr.q.BrokerName + "/" + fmt.Sprint(tr.q.QueueID)
	}
	sc.commit = &publishHook{w: wr, j: j, lost: tr.lost}
	j.scope = sc
	return j.Run(ctx)
}

func indexOf(qs []protocol.MessageQueue, q protocol.MessageQueue) int {
	for i := range qs {
		if qs[i] == q {
			return i
		}
	}
	return -1
}

// repartOf returns a keyed stage head's repartition topic and its queues
// by range.
func (w *worker) repartOf(n *node) (string, []protocol.MessageQueue) {
	st := w.stages[n.uid]
	if st == nil {
		return "", nil
	}
	return st.input, st.layout.Queues(st.input)
}

// publishHook publishes a task's checkpoints through its writer.
type publishHook struct {
	w    *scaleout.Writer
	j    *Job
	lost <-chan struct{}
}

func (h *publishHook) PrepareCommit(c *checkpoint.Commit) { h.w.PrepareCommit(c) }

func (h *publishHook) PublishCommit(ctx context.Context, md checkpoint.Metadata, c *checkpoint.Commit) error {
	select {
	case <-h.lost:
		return fmt.Errorf("%w: the task's queue lock was lost", scaleout.ErrFenced)
	default:
	}
	sinks := make([]scaleout.SinkTxn, 0, len(c.Pending))
	for _, pc := range c.Pending {
		sinks = append(sinks, scaleout.SinkTxn{Sink: pc.SinkUID, Epoch: pc.CheckpointID})
	}
	if err := h.w.Publish(ctx, md, c.Batch, sinks); err != nil {
		return err
	}
	if eng := h.j.engine.Load(); eng != nil {
		h.w.MaybeSnapshot(eng.Store())
	}
	return nil
}

// Close waits for a snapshot in progress (before the engine closes the
// store).
func (h *publishHook) Close() error { return h.w.Close() }
