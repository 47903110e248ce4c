package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/jobinfo"
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
// RunWorker join (default: the job's name, which is also its RocketMQ
// sources' default group). Every worker of one job must use the same.
func WorkerGroup(g string) JobOption { return jobOptionFunc(func(c *jobConfig) { c.workerGroup = g }) }

// Standbys sets how many workers of a job run with RunWorker keep a warm
// copy of each task's state besides its owner (default 0): a standby
// applies the task's published checkpoints as they come, so that when the
// owner dies, the worker that inherits the task (most often the standby:
// see internal/scaleout.StandbyOf) replays only the lag instead of
// rebuilding the state from the broker's snapshot.
func Standbys(n int) JobOption { return jobOptionFunc(func(c *jobConfig) { c.standbys = n }) }

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
// run again while they stay assigned, except a task whose state cannot be
// rebuilt (ErrTaskStateLost): that is never started empty.
//
// RunWorker returns when ctx is cancelled (after every task stopped with a
// final checkpoint, its queues handed back) or on an error that leaves the
// worker unable to take part: ErrWorkerFingerprint, ErrTaskStateLost (after
// stopping its other tasks the same way), a graph that cannot be
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
	head     string // UID of the head operator
	keyed    bool
	input    string // the topic whose queues are the stage's tasks
	layout   scaleout.Layout
	commit   string
	change   string
	origins  []string // keyed: the tasks of the stages feeding it
	upstream []string // keyed: the heads of those stages
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
	alloc    *recordingAllocator
	wg       sync.WaitGroup

	// fatal is closed when a task's state is lost (worker_lost.go): the
	// worker stops and RunWorker returns fatalErr.
	fatal     chan struct{}
	fatalOnce sync.Once
	fatalErr  error

	mu struct {
		sync.Mutex
		tasks    map[protocol.MessageQueue]*taskRun
		standbys map[protocol.MessageQueue]*standbyRun
		// stopping holds revoked tasks until they have stopped: their
		// directory is still theirs (no standby copy starts in it, and a
		// task of the queue assigned again waits for them).
		stopping map[protocol.MessageQueue]*taskRun
	}
	// status (worker_status.go)
	statusMu  sync.Mutex
	handoffs  []WorkerHandoff
	standbyAt map[string]uint64
}

// Lock renewal of a worker's queues: the broker's expiry is 60 s by default
// (Java); a worker renews every lockRenew and trusts a lock for lockValidity
// after the request that granted it.
const (
	lockRenew    = 2 * time.Second
	lockValidity = 20 * time.Second
	lockRetry    = 100 * time.Millisecond
)

// standbyRun is a warm copy this worker keeps of a task it does not own.
type standbyRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// taskRun is one task this worker owns.
type taskRun struct {
	q      protocol.MessageQueue
	stage  *stageInfo
	id     scaleout.TaskID
	cancel context.CancelFunc
	done   chan struct{}
	// prev is the queue's previous run on this worker when it was revoked
	// and had not stopped yet (OnRevoke gave up waiting): this run starts
	// after it.
	prev *taskRun

	// lockedUntil is when the task's broker lock stops being trusted (zero
	// while the worker waits for it: before a run, or after losing it);
	// attempt is the run in progress (nil between runs).
	lockMu      sync.Mutex
	lockedUntil time.Time
	attempt     *taskAttempt

	// status (worker_status.go)
	statusMu sync.Mutex
	state    string
	owner    uint64
	since    time.Time
	restore  *RestoreStatus
	lastErr  string
	job      *Job
}

// taskAttempt is one run of a task (one claim).
type taskAttempt struct {
	cancel context.CancelFunc
	// lost is closed when the queue's lock was lost: the run must not
	// publish another checkpoint.
	lost chan struct{}
	once sync.Once
}

func (a *taskAttempt) fence() {
	a.once.Do(func() { close(a.lost) })
	a.cancel()
}

func (a *taskAttempt) fenced() bool {
	select {
	case <-a.lost:
		return true
	default:
		return false
	}
}

// begin starts a run of the task under ctx.
func (tr *taskRun) begin(ctx context.Context) (context.Context, *taskAttempt) {
	actx, cancel := context.WithCancel(ctx)
	a := &taskAttempt{cancel: cancel, lost: make(chan struct{})}
	tr.lockMu.Lock()
	tr.attempt = a
	tr.lockMu.Unlock()
	return actx, a
}

// loseLock stops the run in progress before its next commit: the queue's
// lock is another member's now. The task stays assigned: it runs again once
// the lock is back (or its holder left the group).
func (tr *taskRun) loseLock() {
	tr.lockMu.Lock()
	tr.lockedUntil = time.Time{}
	a := tr.attempt
	tr.lockMu.Unlock()
	if a != nil {
		a.fence()
	}
}

// fence stops the task for good (revoked): its run publishes nothing more.
func (tr *taskRun) fence() {
	tr.lockMu.Lock()
	a := tr.attempt
	tr.lockMu.Unlock()
	if a != nil {
		a.fence()
	}
	tr.cancel()
}

func newWorker(ctx context.Context, c *client.Client, name string, build func(*Job) error, opts []JobOption) (*worker, error) {
	tmpl := New(name, opts...)
	if err := build(tmpl); err != nil {
		return nil, fmt.Errorf("pipeline: build %s: %w", name, err)
	}
	if err := tmpl.validate(); err != nil {
		return nil, err
	}
	if err := tmpl.checkSingleProcess(); err != nil { // rebalance.go
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
		stages: map[string]*stageInfo{}, byIn: map[string]*stageInfo{}, fatal: make(chan struct{})}
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
	for _, n := range tmpl.nodes {
		if n.broadcast {
			return fmt.Errorf("%w: operator %q: %w", ErrInvalidGraph, n.uid, ErrBroadcastScaleout) // broadcast.go
		}
	}
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
					w.stages[o.uid].upstream = append(w.stages[o.uid].upstream, h.uid)
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
	w.mu.standbys = map[protocol.MessageQueue]*standbyRun{}
	w.mu.stopping = map[protocol.MessageQueue]*taskRun{}
	w.standbyAt = map[string]uint64{}
	// No compression: this producer sends the changelog, whose chunks of
	// state a new owner must read back fast; inflating zlib was about half
	// of a restore's reading (BenchmarkScaleoutHandoff's 1 GB row), and the
	// store compresses its tables anyway.
	p, err := client.NewProducer(w.c, w.group+"_worker", client.WithCompression(0, 0))
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
	// The worker locks its queues itself (not the group consumer's locking
	// mode): the lock of a task whose latest owner has left the group is
	// released on its behalf and taken at once, instead of after the broker
	// expires it (60 s by default).
	w.alloc = &recordingAllocator{inner: scaleout.Sticky(), seen: map[string]allocInput{}}
	gc, err := client.NewGroupConsumer(w.c, w.group, client.WithAllocator(w.alloc), client.WithListener(w))
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
	if w.cfg.statusAddr != "" {
		stop, err := w.serveStatus(ctx, w.cfg.statusAddr, w.cfg.onStatusAddr)
		if err != nil {
			return errors.Join(err, gc.Close())
		}
		defer stop()
	}
	loops, stopLoops := context.WithCancel(context.Background())
	var lw sync.WaitGroup
	lw.Go(func() { w.lockLoop(loops) })
	if w.cfg.standbys > 0 {
		lw.Go(func() { w.standbyLoop(loops) })
	}
	w.log.Info("worker started", "job", w.name, "group", w.group, "stages", len(w.stages), "standbys", w.cfg.standbys)
	select {
	case <-ctx.Done():
	case <-w.fatal:
	}
	// Close revokes every queue (OnRevoke stops its task with a final
	// checkpoint and unlocks it).
	cerr := gc.Close()
	stopLoops()
	lw.Wait()
	w.stopStandbys(nil)
	w.wg.Wait()
	select {
	case <-w.fatal:
		return errors.Join(w.fatalErr, cerr)
	default:
	}
	return cerr
}

// allocInput is what the group consumer last allocated one topic from.
type allocInput struct {
	members []string
	queues  []protocol.MessageQueue
}

// recordingAllocator allocates with inner and remembers the member and
// queue lists per topic (the worker places standbys from them).
type recordingAllocator struct {
	inner client.Allocator
	mu    sync.Mutex
	seen  map[string]allocInput
}

func (a *recordingAllocator) Allocate(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
	if len(queues) > 0 {
		a.mu.Lock()
		a.seen[queues[0].Topic] = allocInput{members: slices.Clone(members), queues: slices.Clone(queues)}
		a.mu.Unlock()
	}
	return a.inner.Allocate(self, members, queues)
}

func (a *recordingAllocator) input(topic string) (allocInput, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	in, ok := a.seen[topic]
	return in, ok
}

// checkFingerprint refuses to start when any task's latest record was
// written by a job with another fingerprint.
func (w *worker) checkFingerprint(ctx context.Context) error {
	for _, st := range w.stages {
		for _, q := range st.layout.Queues(st.input) {
			id := taskOf(st, q).String()
			if err := w.follower.Ready(ctx, id); err != nil {
				if isStateLost(err) {
					return stateLostError(id, err)
				}
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
func (w *worker) OnAssign(ctx context.Context, qs []protocol.MessageQueue) {
	for _, q := range qs {
		st := w.byIn[q.Topic]
		if st == nil {
			continue
		}
		if q.QueueID >= w.layoutOf(st)[q.BrokerName] {
			if err := w.extend(ctx, st); err != nil {
				w.log.Warn("a new queue of the job's input could not be given its job topics; it is left to the next rebalance", "queue", q.String(), "err", err)
				continue
			}
		}
		w.mu.Lock()
		if w.mu.tasks[q] != nil {
			w.mu.Unlock()
			continue
		}
		tctx, cancel := context.WithCancel(context.Background())
		tr := &taskRun{q: q, stage: st, id: taskOf(st, q), cancel: cancel, done: make(chan struct{}),
			state: "waiting-lock", since: time.Now(), prev: w.mu.stopping[q]}
		w.mu.tasks[q] = tr
		w.mu.Unlock()
		// Its copy becomes the owner's store. Stopped after the task is
		// registered: the standby loop starts no copy of a task the worker
		// owns, so none can start again between this and the task's restore
		// (two writers of one directory).
		w.stopStandbys([]protocol.MessageQueue{q})
		w.handoff(tr.id.String(), "assigned", "")
		w.wg.Go(func() {
			defer close(tr.done)
			w.runTask(tctx, tr)
			w.mu.Lock()
			if w.mu.stopping[q] == tr {
				delete(w.mu.stopping, q)
			}
			w.mu.Unlock()
		})
	}
}

// extend grows a source stage to its topic's current queues (queues were
// added to the topic): the job topics get the queues, the follower the new
// tasks' chains, and keyed stages fed by it the new origins.
func (w *worker) extend(ctx context.Context, st *stageInfo) error {
	if st.keyed {
		return fmt.Errorf("keyed stage %s has a fixed number of ranges", st.head)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := scaleout.SourceLayout(ctx, w.c, st.input)
	if err != nil {
		return err
	}
	if err := scaleout.EnsureTopics(ctx, w.c, w.name, st.head, l, scaleout.KindCommit, scaleout.KindChangelog); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	old := st.layout
	st.layout = l
	for _, q := range l.Queues(st.input) {
		if q.QueueID < old[q.BrokerName] {
			continue
		}
		id := taskOf(st, q)
		w.follower.Follow(id.String(), st.taskLog(id).Commit)
		for _, down := range w.stages {
			if down.keyed && slices.Contains(down.upstream, st.head) {
				down.origins = append(down.origins, id.String())
			}
		}
		w.log.Info("new queue of the job's input: a new task", "task", id.String())
	}
	return nil
}

// stopTimeout bounds a task's final checkpoint on revocation.
const stopTimeout = 30 * time.Second

// OnRevoke stops the queues' tasks, each with a final checkpoint, then
// releases their locks.
func (w *worker) OnRevoke(ctx context.Context, qs []protocol.MessageQueue) {
	var stopping []*taskRun
	w.mu.Lock()
	for _, q := range qs {
		if tr := w.mu.tasks[q]; tr != nil {
			delete(w.mu.tasks, q)
			w.mu.stopping[q] = tr
			stopping = append(stopping, tr)
		}
	}
	w.mu.Unlock()

	for _, tr := range stopping {
		w.handoff(tr.id.String(), "revoked", "")
		tr.cancel()
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	var unlock []protocol.MessageQueue
	for _, tr := range stopping {
		select {
		case <-tr.done:
		case <-t.C:
			w.log.Warn("task did not stop in time; its lock is released anyway (the chain fences it)", "task", tr.id.String())
			tr.fence()
		}
		unlock = append(unlock, tr.q)
	}
	if len(unlock) > 0 {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		w.gc.UnlockQueues(uctx, unlock...)
		cancel()
	}
}

// acquire waits until the task's queue is locked for this worker; a task
// never runs without its lock. It returns false when ctx ends first.
func (w *worker) acquire(ctx context.Context, tr *taskRun) bool {
	logged := false
	for ctx.Err() == nil {
		if w.lock(ctx, tr) {
			return true
		}
		// Refused: a member holds the lock. When the task's latest owner
		// (the chain's latest writer, read to the chain's current end) has
		// left the group, the lock is most likely its: the broker would keep
		// it until it expires (60 s by default) and the task would stall, so
		// release it on the departed owner's behalf and lock the queue. If
		// the lock is still refused, a live member holds it (it just got the
		// queue and has not claimed it yet): wait, as for any holder.
		holder := w.latestOwner(ctx, tr)
		if holder != "" && holder != w.c.ClientID() {
			members, err := w.gc.Members(ctx, tr.q.Topic)
			if err == nil && !slices.Contains(members, holder) {
				w.gc.UnlockQueuesFor(ctx, holder, tr.q)
				if w.lock(ctx, tr) {
					w.log.Info("took a task whose owner left the group, releasing its queue lock", "task", tr.id.String(), "owner", holder)
					return true
				}
			}
		}
		if !logged {
			w.log.Info("waiting for a task's lock", "task", tr.id.String(), "latest owner", holder)
			logged = true
		}
		if backoff.Sleep(ctx, lockRetry) != nil {
			return false
		}
	}
	return false
}

// lock asks the broker for tr's queue lock and, when granted, trusts it for
// lockValidity from the request's start.
func (w *worker) lock(ctx context.Context, tr *taskRun) bool {
	sent := time.Now()
	if got := w.gc.LockQueues(ctx, tr.q); len(got) != 1 {
		return false
	}
	tr.lockMu.Lock()
	tr.lockedUntil = sent.Add(lockValidity)
	tr.lockMu.Unlock()
	return true
}

// latestOwner returns the worker that wrote the latest valid record of tr's
// chain, read up to the commit queue's current end ("" when the chain has
// none or could not be read in time).
func (w *worker) latestOwner(ctx context.Context, tr *taskRun) string {
	tl := tr.stage.taskLog(tr.id)
	w.follower.Follow(tl.Task, tl.Commit)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if w.follower.Ready(ctx, tl.Task) != nil {
		return ""
	}
	end, err := w.c.MaxOffset(ctx, tl.Commit)
	if err != nil || w.follower.WaitPast(ctx, tl.Task, end-1) != nil {
		return ""
	}
	v, err := w.follower.View(tl.Task)
	if err != nil || v.Latest == nil {
		return ""
	}
	return v.Latest.Worker
}

// lockLoop renews the locks of the worker's tasks and fences a task whose
// lock another member now holds or whose lock could not be renewed within
// its validity.
func (w *worker) lockLoop(ctx context.Context) {
	t := time.NewTicker(lockRenew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		trs := make([]*taskRun, 0, len(w.mu.tasks))
		for _, tr := range w.mu.tasks {
			trs = append(trs, tr)
		}
		w.mu.Unlock()
		if len(trs) == 0 {
			continue
		}
		qs := make([]protocol.MessageQueue, len(trs))
		for i, tr := range trs {
			qs[i] = tr.q
		}
		sent := time.Now()
		granted := w.gc.LockQueues(ctx, qs...)
		members := map[string][]string{}
		for _, tr := range trs {
			tr.lockMu.Lock()
			had := !tr.lockedUntil.IsZero()
			if slices.Contains(granted, tr.q) {
				tr.lockedUntil = sent.Add(lockValidity)
				tr.lockMu.Unlock()
				continue
			}
			lapsed := had && time.Now().After(tr.lockedUntil)
			tr.lockMu.Unlock()
			if !had {
				continue // waiting for it in acquire
			}
			// Refused: another member holds it (we lost it while paused, or
			// the broker restarted and someone locked first), or the request
			// failed and the validity lapsed.
			ms, ok := members[tr.q.Topic]
			if !ok {
				ms, _ = w.gc.Members(ctx, tr.q.Topic)
				members[tr.q.Topic] = ms
			}
			if (lapsed || ms != nil) && !(failpoint.Enabled && w.cfg.scaleFaults.KeepLostLocks) {
				w.log.Warn("queue lock lost: stopping its task before its next commit; it runs again once the lock is back", "task", tr.id.String())
				w.handoff(tr.id.String(), "fenced", "queue lock lost")
				tr.loseLock()
			}
		}
	}
}

// runTask runs a task until its ctx ends (the queue is revoked): it waits
// for the queue's lock, claims the task and runs it; after a failure or a
// lost lock it does so again. A bounded task that finished is not run again.
func (w *worker) runTask(ctx context.Context, tr *taskRun) {
	if tr.prev != nil { // the queue's previous run on this worker, revoked, still stopping
		select {
		case <-tr.prev.done:
		case <-ctx.Done():
			return
		}
	}
	bo := backoff.Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second}
	lost := 0 // runs in a row that found the task's state gone
	for attempt := 0; ctx.Err() == nil; attempt++ {
		tr.setState("waiting-lock")
		if !w.acquire(ctx, tr) {
			return
		}
		actx, a := tr.begin(ctx)
		err := w.runTaskOnce(actx, tr, a)
		a.cancel()
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				w.log.Warn("task stopped", "task", tr.id.String(), "err", err)
			}
			return
		}
		if err == nil {
			tr.setState("finished")
			w.handoff(tr.id.String(), "finished", "")
			return
		}
		tr.statusMu.Lock()
		tr.state, tr.lastErr = "failed", err.Error()
		tr.statusMu.Unlock()
		if a.fenced() {
			attempt = -1 // the lock was lost: wait for it again at once
			continue
		}
		if isStateLost(err) {
			if lost++; lost >= lostAttempts {
				err = stateLostError(tr.id.String(), err)
				tr.statusMu.Lock()
				tr.state, tr.lastErr = "state-lost", err.Error()
				tr.statusMu.Unlock()
				w.handoff(tr.id.String(), "state-lost", err.Error())
				w.log.Error("task state lost: the worker stops", "task", tr.id.String(), "err", err)
				w.giveUp(err)
				return
			}
		} else {
			lost = 0
		}
		ev := "failed"
		if errors.Is(err, scaleout.ErrFenced) {
			ev = "fenced"
		}
		w.handoff(tr.id.String(), ev, err.Error())
		if errors.Is(err, scaleout.ErrFingerprint) || isStateLost(err) {
			w.log.Error("task cannot run on this worker", "task", tr.id.String(), "err", err)
		} else {
			w.log.Warn("task failed; claiming it again", "task", tr.id.String(), "err", err)
		}
		if backoff.Sleep(ctx, bo.Delay(attempt)) != nil {
			return
		}
	}
}

func (w *worker) runTaskOnce(ctx context.Context, tr *taskRun, a *taskAttempt) error {
	st, id := tr.stage, tr.id
	tl := st.taskLog(id)
	tr.setState("claiming")
	cfg := scaleout.WriterConfig{Client: w.c, Producer: w.producer, Follower: w.follower, Group: w.group, Log: tl,
		Worker: w.c.ClientID(), Fingerprint: w.fpHash, SnapshotEvery: w.cfg.snapshotEvery, Logger: w.log,
		SkipConfirm: failpoint.Enabled && w.cfg.scaleFaults.SkipConfirm}
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
	tr.statusMu.Lock()
	tr.state, tr.owner = "restoring", wr.OwnerEpoch()
	tr.statusMu.Unlock()
	w.handoff(tl.Task, "claimed", fmt.Sprintf("owner epoch %d", wr.OwnerEpoch()))
	started := time.Now()
	rep, err := scaleout.Restore(ctx, w.c, w.group, tl, dir, base, v, checkpoint.Options{Fingerprint: w.fp, Logger: w.log})
	if err != nil {
		return err
	}
	rs := &RestoreStatus{Reused: rep.Reused, FromSnapshot: rep.FromSnapshot, Segments: rep.Applied, Bytes: rep.Bytes, Duration: time.Since(started)}
	if base != nil {
		rs.Checkpoint = base.Seq
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
	w.mu.Lock()
	origins := slices.Clone(st.origins)
	w.mu.Unlock()
	sc := &taskScope{head: head, local: stageNodes(head), task: tl.Task, owner: wr.OwnerEpoch(), origins: origins,
		io: &scaleIO{client: w.c, producer: w.producer, group: w.group, dec: w.follower, repart: w.repartOf,
			readUncommitted: failpoint.Enabled && w.cfg.scaleFaults.ReadUncommitted}}
	if st.keyed {
		queues := w.layoutOf(st).Queues(st.input)
		r := indexOf(queues, tr.q)
		if r < 0 {
			return fmt.Errorf("pipeline: queue %s is not in %s's layout", tr.q, st.head)
		}
		sc.kgStart, sc.kgEnd = keyGroupRangeOf(w.cfg.maxParallelism, len(queues), r)
		sc.io.input = tr.q
	} else {
		sc.split = tr.q.BrokerName + "/" + fmt.Sprint(tr.q.QueueID)
	}
	sc.commit = &publishHook{w: wr, j: j, lost: a.lost}
	sc.chains = chainsView{w.follower}
	j.scope = sc
	tr.statusMu.Lock()
	tr.state, tr.restore, tr.job, tr.lastErr, tr.since = "running", rs, j, "", time.Now()
	tr.statusMu.Unlock()
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
	return st.input, w.layoutOf(st).Queues(st.input)
}

// layoutOf returns st's layout (extend may replace it).
func (w *worker) layoutOf(st *stageInfo) scaleout.Layout {
	w.mu.Lock()
	defer w.mu.Unlock()
	return st.layout
}

// chainsView is the worker's follower as jobinfo.Chains (what sinks answer
// check-backs with).
type chainsView struct{ f *scaleout.Follower }

func (v chainsView) Decide(task string, ownerEpoch, epoch uint64) (jobinfo.Verdict, error) {
	verdict, err := v.f.Decide(task, ownerEpoch, epoch)
	switch verdict {
	case scaleout.Valid:
		return jobinfo.Valid, err
	case scaleout.Invalid:
		return jobinfo.Invalid, err
	}
	return jobinfo.Undecided, err
}

func (v chainsView) SinkInfo(task, sink string, epoch uint64) ([]byte, bool) {
	return v.f.SinkInfo(task, sink, epoch)
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
		st := scaleout.SinkTxn{Sink: pc.SinkUID, Epoch: pc.CheckpointID}
		if n := h.j.uids[pc.SinkUID]; n != nil {
			if ti, ok := n.sink.(jobinfo.TxnInfoer); ok {
				info, err := ti.TxnInfo(pc.Data)
				if err != nil {
					return fmt.Errorf("sink %q: check-back information of checkpoint %d: %w", pc.SinkUID, pc.CheckpointID, err)
				}
				st.Info = info
			}
		}
		sinks = append(sinks, st)
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

// standbyEvery is how often a worker reconsiders which tasks it keeps warm
// copies of (and a copy catches up at the latest).
const standbyEvery = 500 * time.Millisecond

// standbyLoop keeps the worker's standby copies: for every task it does not
// own and for which it is among the Standbys best-scoring members besides
// the owner, a copy in the task's directory that follows the task's
// published checkpoints.
func (w *worker) standbyLoop(ctx context.Context) {
	t := time.NewTicker(standbyEvery)
	defer t.Stop()
	self := w.c.ClientID()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		want := map[protocol.MessageQueue]*stageInfo{}
		for _, st := range w.stages {
			in, ok := w.alloc.input(st.input)
			if !ok {
				continue
			}
			for _, q := range in.queues {
				if slices.Contains(standbysOf(in.members, in.queues, q, w.cfg.standbys), self) {
					want[q] = st
				}
			}
		}
		var drop []protocol.MessageQueue
		w.mu.Lock()
		for q := range w.mu.standbys {
			if want[q] == nil || w.mu.tasks[q] != nil {
				drop = append(drop, q)
			}
		}
		for q, st := range want {
			if w.mu.tasks[q] != nil || w.mu.standbys[q] != nil || w.mu.stopping[q] != nil {
				continue
			}
			sctx, cancel := context.WithCancel(ctx)
			sb := &standbyRun{cancel: cancel, done: make(chan struct{})}
			w.mu.standbys[q] = sb
			id := taskOf(st, q)
			w.wg.Go(func() {
				defer close(sb.done)
				w.runStandby(sctx, st, id)
			})
		}
		w.mu.Unlock()
		if len(drop) > 0 { // stopStandbys(nil) stops every copy
			w.stopStandbys(drop)
		}
	}
}

// standbysOf returns the n best-scoring members for q besides its owner.
func standbysOf(members []string, queues []protocol.MessageQueue, q protocol.MessageQueue, n int) []string {
	var out []string
	rest := members
	for range n {
		sb := scaleout.StandbyOf(rest, queues, q)
		if sb == "" {
			break
		}
		out = append(out, sb)
		rest = slices.DeleteFunc(slices.Clone(rest), func(m string) bool { return m == sb })
		if len(rest) < 2 {
			break
		}
	}
	return out
}

// stopStandbys stops the copies of qs (every copy when qs is nil) and
// waits for them.
func (w *worker) stopStandbys(qs []protocol.MessageQueue) {
	w.mu.Lock()
	var stop []*standbyRun
	for q, sb := range w.mu.standbys {
		if qs == nil || slices.Contains(qs, q) {
			delete(w.mu.standbys, q)
			stop = append(stop, sb)
		}
	}
	w.mu.Unlock()
	for _, sb := range stop {
		sb.cancel()
		<-sb.done
	}
}

// runStandby keeps the task's directory at the task's latest published
// checkpoint, applying each one's changes as it is confirmed.
func (w *worker) runStandby(ctx context.Context, st *stageInfo, id scaleout.TaskID) {
	tl := st.taskLog(id)
	dir := filepath.Join(w.cfg.dir, "tasks", id.Dir())
	var at uint64
	for ctx.Err() == nil {
		changed := w.follower.Changed()
		v, err := w.follower.View(tl.Task)
		if err == nil && v.Latest != nil && v.Latest.Seq != at {
			rep, err := scaleout.Restore(ctx, w.c, w.group, tl, dir, v.Latest, v, checkpoint.Options{Fingerprint: w.fp, Logger: w.log})
			switch {
			case err == nil:
				at = v.Latest.Seq
				w.statusMu.Lock()
				w.standbyAt[tl.Task] = at
				w.statusMu.Unlock()
				if !rep.Reused || rep.Applied > 0 {
					w.log.Debug("standby caught up", "task", tl.Task, "checkpoint", at, "segments", rep.Applied, "snapshot", rep.FromSnapshot)
				}
			case ctx.Err() == nil:
				// Retried after a second whether or not the chain
				// changes again: an idle task publishes nothing more, and
				// waiting for a change left the copy behind for good.
				w.log.Warn("standby could not follow its task; retried", "task", tl.Task, "err", err)
				_ = backoff.Sleep(ctx, time.Second)
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-changed:
		}
	}
}
