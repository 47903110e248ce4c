package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

var (
	// ErrInvalidConfig is returned by New for an unusable Config.
	ErrInvalidConfig = errors.New("runtime: invalid config")
	// ErrCheckpointFailed is returned by Run when more consecutive
	// checkpoints failed than the Config tolerates, or a final checkpoint
	// could not be taken.
	ErrCheckpointFailed = errors.New("runtime: checkpoint failed")
	// ErrStarted is returned when an Engine is run twice or a task is added
	// after Run.
	ErrStarted = errors.New("runtime: engine already started")
	// ErrPublish is returned by Run when Config.Commit refused to publish a
	// checkpoint.
	ErrPublish = errors.New("runtime: checkpoint not published")
	// ErrDirLocked is returned (wrapped) by New when another process, or
	// another Engine of this one, holds the checkpoint directory.
	ErrDirLocked = errors.New("runtime: checkpoint directory in use")
)

// locked reports whether err from opening a checkpoint store says that its
// directory's lock is held: by another process (flock's EWOULDBLOCK, which
// the OS words "resource temporarily unavailable") or by this one.
func locked(err error) bool {
	return errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EAGAIN) ||
		strings.Contains(err.Error(), "lock held by current process")
}

// Config configures an Engine. It is plain data; New validates it.
type Config struct {
	// Name is the job's name (status endpoint, logs).
	Name string
	// Dir is the job's checkpoint directory. Empty means an ephemeral store in
	// a temporary directory removed by Close (nothing survives the process).
	Dir string
	// Interval between periodic checkpoints; 0 disables them (bounded jobs
	// still take a final checkpoint, stopped jobs a stop checkpoint).
	Interval time.Duration
	// Timeout aborts a checkpoint not acknowledged by every task in time
	// (default 1 minute).
	Timeout time.Duration
	// MinPause is the minimum time between the end of a checkpoint and the
	// start of the next.
	MinPause time.Duration
	// TolerableFailures is how many consecutive failed checkpoints the job
	// survives; one more fails it.
	TolerableFailures int
	// Fingerprint is checked against the latest completed checkpoint.
	Fingerprint checkpoint.Fingerprint
	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
	// Clock returns the current time (checkpoint metadata, processing time);
	// nil is time.Now.
	Clock func() time.Time
	// StatusAddr, when set, serves the JSON status endpoint there (host:port;
	// port 0 picks one, see Engine.StatusAddr).
	StatusAddr string
	// Hooks observe the job (see Hook): checkpoints, records, metrics.
	Hooks []Hook
	// MetricsAddr, when set, serves /metrics there (host:port; port 0
	// picks one, see Engine.MetricsAddr) with the handler of the first hook
	// implementing HookMetricsHandler.
	MetricsAddr string
	// DiscoveryInterval is the period of the discovery callback set with
	// OnDiscover (0: only on demand, see DiscoverNow).
	DiscoveryInterval time.Duration
	// Commit, when set, takes part in every checkpoint commit (scale-out
	// publishes each task's checkpoints to the broker); nil for a job that
	// runs in one process.
	Commit CommitHook
	// KeepCheckpoints is how many retained copies of completed checkpoints
	// the job keeps in Dir (restorable with RestoreFrom), taken at most
	// every RetainInterval (0: after every checkpoint). See savepoint.go.
	KeepCheckpoints int
	RetainInterval  time.Duration
	// RestoreFrom, when set, restores the job from that retained checkpoint
	// id or savepoint (checkpoint.RestoreFrom) before it starts; applied
	// once, so a restart with the same value resumes from the latest
	// checkpoint.
	RestoreFrom string
}

// CommitHook takes part in an Engine's checkpoint commits.
type CommitHook interface {
	// PrepareCommit is called with each checkpoint before its batch is
	// written; it may add offsets and ask for the batch
	// (checkpoint.Commit.CaptureBatch).
	PrepareCommit(c *checkpoint.Commit)
	// PublishCommit is called once the checkpoint is durable in the store
	// and before any task learns that it completed (so before any sink
	// commits a transaction of it). An error fails the job with
	// ErrPublish: the checkpoint is durable locally but does not count, and
	// nothing of it may be committed.
	PublishCommit(ctx context.Context, md checkpoint.Metadata, c *checkpoint.Commit) error
	// A hook that also has a Close() error method is closed before the
	// engine closes its store.
}

// Engine runs one job's tasks and coordinates its checkpoints. Create it with
// New, register tasks with AddTask, then call Run once. Its methods are safe
// for concurrent use.
//
// Its exported methods are the interface of a task-graph builder (package
// pipeline is the one in this module): registering tasks and their
// counters, the restored offsets and store, the status graph, savepoints.
// Code that only observes a job gets a JobView instead (hooks), or the
// status endpoint; see the package documentation.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	store   *checkpoint.Store
	tmpDir  string
	offsets map[string][]byte // restored, read-only after New

	wake     chan struct{} // coordinator wake-up, cap 1
	discover func(ctx context.Context) error
	discNow  chan struct{} // DiscoverNow requests, cap 1
	started  atomic.Bool
	closed   atomic.Bool
	wanted   atomic.Bool // a task asked for an early checkpoint (Handle.RequestCheckpoint)
	ids      atomic.Uint64
	statusLn net.Listener
	obs      hooks      // hooks.go
	page     statusPage // statuspage.go
	sp       savepoints // savepoint.go

	mu struct {
		sync.Mutex
		tasks     []*Handle
		inflight  *inflight
		finished  int
		errs      []error
		resolved  []checkpoint.PendingCommit
		carry     []checkpoint.PendingCommit
		committed map[string][]byte // offsets as of the last completed checkpoint
		added     []*Handle         // tasks added by the discovery callback, not started yet
		adding    bool              // the discovery callback runs: AddTask may add tasks
		history   []CheckpointStatus
		operators []*OperatorStats
		state     string
		describe  map[string]func([]byte) string // offset describers by source UID (watermarks.go)
	}
}

type inflight struct {
	id      uint64
	stop    bool
	final   bool
	started time.Time
	acks    map[int]Ack
	sps     []*spRequest // savepoint requests this checkpoint serves (savepoint.go)
}

// New validates cfg and opens the job's checkpoint store (restoring nothing
// yet: offsets and pending commits are read by the tasks through
// RestoredOffset and Store).
func New(cfg Config) (*Engine, error) {
	if cfg.Interval < 0 || cfg.Timeout < 0 || cfg.MinPause < 0 || cfg.TolerableFailures < 0 || cfg.DiscoveryInterval < 0 {
		return nil, fmt.Errorf("%w: negative duration or failure count", ErrInvalidConfig)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	e := &Engine{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), discNow: make(chan struct{}, 1)}
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dir := cfg.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "runnel-job-")
		if err != nil {
			return nil, fmt.Errorf("runtime: ephemeral checkpoint dir: %w", err)
		}
		e.tmpDir, dir = tmp, tmp
	}
	e.sp.init()
	var err error
	if cfg.RestoreFrom != "" {
		err = e.restoreFrom(dir) // savepoint.go
	}
	var store *checkpoint.Store
	if err == nil {
		store, err = checkpoint.Open(dir, checkpoint.Options{Logger: cfg.Logger, Fingerprint: cfg.Fingerprint, KeepCopies: cfg.KeepCheckpoints})
	}
	if err != nil {
		e.removeTmp()
		if locked(err) {
			return nil, fmt.Errorf("%w: %s is locked: is the job (or runnel checkpoint) already running on it? "+
				"Each running job needs a checkpoint directory of its own (%w)", ErrDirLocked, dir, err)
		}
		return nil, fmt.Errorf("runtime: open checkpoint store: %w", err)
	}
	e.store = store
	if md, ok := store.Latest(); ok {
		e.ids.Store(md.ID)
		if e.offsets, err = store.Offsets(); err != nil {
			_ = store.Close() // the Offsets error is the one to report
			e.removeTmp()
			return nil, fmt.Errorf("runtime: restore offsets: %w", err)
		}
		e.log.Info("restoring from checkpoint", "job", cfg.Name, "checkpoint", md.ID, "offsets", len(e.offsets))
	}
	e.mu.committed = make(map[string][]byte, len(e.offsets))
	for k, v := range e.offsets {
		e.mu.committed[k] = v
	}
	e.mu.state = "created"
	if cfg.StatusAddr != "" {
		ln, err := net.Listen("tcp", cfg.StatusAddr)
		if err != nil {
			_ = store.Close() // the Listen error is the one to report
			e.removeTmp()
			return nil, fmt.Errorf("runtime: status endpoint: %w", err)
		}
		e.statusLn = ln
	}
	if err := e.initHooks(); err != nil {
		if e.statusLn != nil {
			_ = e.statusLn.Close() // never served
		}
		_ = store.Close() // the hooks error is the one to report
		e.removeTmp()
		return nil, err
	}
	return e, nil
}

func (e *Engine) removeTmp() {
	if e.tmpDir != "" {
		_ = os.RemoveAll(e.tmpDir) // best effort: a temporary directory
	}
}

// Store returns the job's checkpoint store (for keyed backends and sink
// recovery). It stays open until Run returns.
func (e *Engine) Store() *checkpoint.Store { return e.store }

// Logger returns the engine's logger (never nil).
func (e *Engine) Logger() *slog.Logger { return e.log }

// Now returns the configured clock's time.
func (e *Engine) Now() time.Time { return e.cfg.Clock() }

// Restored reports whether the job restored from a completed checkpoint.
func (e *Engine) Restored() bool { _, ok := e.store.Latest(); return ok }

// RestoredOffset returns the checkpointed offset of a split (nil when the
// split has none: open it at its start position).
func (e *Engine) RestoredOffset(sourceUID, splitID string) []byte {
	return e.offsets[checkpoint.SplitKey(sourceUID, splitID)]
}

// Resolved records sink transactions committed outside a checkpoint (during
// restore); the next checkpoint removes them from the pending list.
func (e *Engine) Resolved(pcs ...checkpoint.PendingCommit) {
	e.mu.Lock()
	e.mu.resolved = append(e.mu.resolved, pcs...)
	e.mu.Unlock()
}

// StatusAddr returns the status endpoint's address, or "" when disabled.
func (e *Engine) StatusAddr() string {
	if e.statusLn == nil {
		return ""
	}
	return e.statusLn.Addr().String()
}

// TaskKind says how a task takes part in checkpoints.
type TaskKind uint8

const (
	// SourceTask reads one split and injects barriers.
	SourceTask TaskKind = iota + 1
	// OperatorTask is a keyed subtask: it aligns barriers and snapshots state.
	OperatorTask
	// SinkTask aligns barriers and flushes or pre-commits a sink.
	SinkTask
)

// AddTask registers a task; Run starts it on its own goroutine with a context
// cancelled on a fatal error. run must return nil only after Handle.Closing
// reports true (or with ctx's error once ctx is done); any other return is
// a job failure. After Run started, tasks can be added only from the
// discovery callback (see OnDiscover); elsewhere AddTask returns ErrStarted.
func (e *Engine) AddTask(name string, kind TaskKind, run func(ctx context.Context, h *Handle) error) (*Handle, error) {
	h := &Handle{e: e, name: name, kind: kind, run: run, wake: make(chan struct{}, 1)}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started.Load() && !e.mu.adding {
		return nil, ErrStarted
	}
	h.idx = len(e.mu.tasks)
	e.mu.tasks = append(e.mu.tasks, h)
	if e.started.Load() {
		e.mu.added = append(e.mu.added, h)
	}
	return h, nil
}

// OnDiscover sets the discovery callback (before Run): the coordinator
// calls fn every Config.DiscoveryInterval and after DiscoverNow, only
// between checkpoints and while no task has finished and the job is not
// stopping. fn may call AddTask (e.g. a source task per new split, after
// wiring it to its downstream tasks); the tasks it adds start when fn
// returns and take part in every later checkpoint. An error from fn fails
// the job, so fn should handle transient errors (log them and retry at
// the next call) and return only those that leave the job inconsistent.
func (e *Engine) OnDiscover(fn func(ctx context.Context) error) { e.discover = fn }

// DiscoverNow asks the coordinator to call the discovery callback as soon as
// no checkpoint is in flight. It does not block; requests coalesce.
func (e *Engine) DiscoverNow() {
	select {
	case e.discNow <- struct{}{}:
	default:
	}
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run starts every task and coordinates checkpoints until the job ends: it
// returns nil when a bounded job drained and its final checkpoint
// completed, or when ctx was cancelled and the stop checkpoint completed; it
// returns an error on a task failure or when checkpoints fail beyond
// tolerance. Run closes the store before returning. It may be called once.
func (e *Engine) Run(ctx context.Context) error {
	if e.started.Swap(true) {
		return ErrStarted
	}
	taskCtx, cancelTasks := context.WithCancel(context.Background())
	defer cancelTasks()
	var wg sync.WaitGroup
	var httpSrv *http.Server
	quitSampler := make(chan struct{}) // statuspage.go
	if e.statusLn != nil {
		httpSrv = &http.Server{Handler: e.statusHandler(), ReadHeaderTimeout: 5 * time.Second}
		wg.Go(func() { e.runSampler(quitSampler) })
		wg.Go(func() {
			if err := httpSrv.Serve(e.statusLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				e.log.Warn("status endpoint stopped", "err", err)
			}
		})
	}
	stopMetrics, endHooks := e.startHooks(&wg) // hooks.go
	e.mu.Lock()
	tasks := append([]*Handle(nil), e.mu.tasks...)
	e.mu.state = "running"
	e.mu.Unlock()
	start := func(h *Handle) {
		wg.Go(func() {
			err := h.run(taskCtx, h)
			if err == nil && !h.Closing() {
				err = fmt.Errorf("runtime: task %s returned before the job closed", h.name)
			}
			if err != nil && taskCtx.Err() == nil {
				e.mu.Lock()
				e.mu.errs = append(e.mu.errs, fmt.Errorf("task %s: %w", h.name, err))
				e.mu.Unlock()
				e.signal()
			}
		})
	}
	for _, h := range tasks {
		start(h)
	}
	c := &coordinator{e: e, tasks: tasks, start: start, userDone: ctx.Done()}
	err := c.run(ctx)
	// c.tasks has the tasks discovery added.
	tasks = c.tasks
	close(e.sp.ended) // savepoint requests fail from here on
	if err != nil {
		cancelTasks()
	} else {
		for _, h := range tasks {
			h.close()
		}
	}
	if httpSrv != nil {
		// Shutdown lets a stop-with-savepoint request get its answer.
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		if httpSrv.Shutdown(sctx) != nil {
			_ = httpSrv.Close() // stops Serve, joined by wg below
		}
		scancel()
	}
	e.sp.bg.Wait() // savepoint files being written (savepoint.go)
	close(quitSampler)
	stopMetrics()
	wg.Wait()
	e.mu.Lock()
	if err == nil && len(e.mu.errs) > 0 {
		err = errors.Join(e.mu.errs...) // failures while closing (e.g. sink commits)
	}
	if err != nil {
		e.mu.state = "failed"
	} else {
		e.mu.state = "finished"
	}
	e.mu.Unlock()
	endHooks(err)
	return errors.Join(err, e.close())
}

func (e *Engine) close() error {
	if e.closed.Swap(true) {
		return nil
	}
	var herr error
	if c, ok := e.cfg.Commit.(interface{ Close() error }); ok {
		herr = c.Close() // e.g. a snapshot still reading the store
	}
	err := errors.Join(herr, e.store.Close())
	e.removeTmp()
	return err
}

// Close releases an Engine that was never Run (Run closes it otherwise). It
// is idempotent.
func (e *Engine) Close() error {
	if e.started.Load() {
		return nil
	}
	if e.statusLn != nil {
		_ = e.statusLn.Close() // never served
	}
	e.closeMetricsListener()
	return e.close()
}

// abortLocked keeps the pre-committed transactions of an abandoned
// checkpoint for the next one.
func (e *Engine) abortLocked(cp *inflight) {
	for _, a := range cp.acks {
		e.mu.carry = append(e.mu.carry, a.Pending...)
	}
	e.recordLocked(CheckpointStatus{ID: cp.id, Result: "timeout", Duration: time.Since(cp.started), Time: e.cfg.Clock()})
}

func (e *Engine) commit(cp *inflight) error {
	c := &checkpoint.Commit{ID: cp.id, Offsets: make(map[string][]byte)}
	if len(cp.sps) > 0 {
		c.Kind = checkpoint.KindSavepoint
	}
	idx := make([]int, 0, len(cp.acks))
	for i := range cp.acks {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		a := cp.acks[i]
		for k, v := range a.Offsets {
			c.Offsets[k] = v
		}
		if a.Part != nil {
			c.Parts = append(c.Parts, a.Part)
		}
		c.Pending = append(c.Pending, a.Pending...)
	}
	e.mu.Lock()
	carry, resolved := e.mu.carry, e.mu.resolved
	e.mu.carry, e.mu.resolved = nil, nil
	e.mu.Unlock()
	c.Pending = append(c.Pending, carry...)
	c.Resolved = resolved
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	if e.cfg.Commit != nil {
		e.cfg.Commit.PrepareCommit(c)
	}
	md, err := e.store.Commit(ctx, c)
	if err == nil && e.cfg.Commit != nil {
		if perr := e.cfg.Commit.PublishCommit(ctx, md, c); perr != nil {
			e.mu.Lock()
			e.recordLocked(CheckpointStatus{ID: cp.id, Result: "not published: " + perr.Error(), Duration: time.Since(cp.started), Time: e.cfg.Clock()})
			e.mu.Unlock()
			return fmt.Errorf("%w: checkpoint %d: %w", ErrPublish, cp.id, perr)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.mu.carry = append(e.mu.carry, c.Pending...)
		e.mu.resolved = append(e.mu.resolved, resolved...)
		e.recordLocked(CheckpointStatus{ID: cp.id, Result: "failed: " + err.Error(), Duration: time.Since(cp.started), Time: e.cfg.Clock()})
		return fmt.Errorf("runtime: commit checkpoint %d: %w", cp.id, err)
	}
	for k, v := range c.Offsets {
		e.mu.committed[k] = v
	}
	e.recordLocked(CheckpointStatus{ID: cp.id, Result: "completed", Duration: time.Since(cp.started), Bytes: md.Bytes, Time: md.Time, StateChanges: md.StateChanges})
	e.log.Debug("checkpoint completed", "job", e.cfg.Name, "checkpoint", cp.id, "bytes", md.Bytes, "duration", time.Since(cp.started))
	return nil
}

func (e *Engine) recordLocked(s CheckpointStatus) {
	const keep = 10
	e.mu.history = append(e.mu.history, s)
	if len(e.mu.history) > keep {
		e.mu.history = append(e.mu.history[:0], e.mu.history[len(e.mu.history)-keep:]...)
	}
}

// ack is called by Handle.Ack.
func (e *Engine) ack(h *Handle, id uint64, a Ack) {
	e.mu.Lock()
	cp := e.mu.inflight
	if cp == nil || cp.id != id {
		// Late acknowledgement of an abandoned checkpoint: keep its
		// transactions and tell the task to merge its snapshot back.
		e.mu.carry = append(e.mu.carry, a.Pending...)
		e.mu.Unlock()
		h.note(Note{ID: id})
		return
	}
	cp.acks[h.idx] = a
	e.mu.Unlock()
	e.signal()
}

// Ack is a task's acknowledgement of a checkpoint.
type Ack struct {
	// Offsets of the task's splits (source tasks), keyed by
	// checkpoint.SplitKey.
	Offsets map[string][]byte
	// Part is the task's state changes (keyed subtasks), nil when none.
	Part checkpoint.Part
	// Pending are the sink transactions the task pre-committed.
	Pending []checkpoint.PendingCommit
}

// Note tells a task the outcome of a checkpoint it acknowledged (or was
// asked to): Completed, or aborted when false.
type Note struct {
	ID        uint64
	Completed bool
}

// Handle is a task's link to the engine. Its methods are safe for concurrent
// use, but each task uses only its own Handle.
type Handle struct {
	e    *Engine
	idx  int
	name string
	kind TaskKind
	run  func(ctx context.Context, h *Handle) error
	wake chan struct{}

	mu struct {
		sync.Mutex
		trigger  uint64
		stop     bool
		acked    uint64
		notes    []Note
		closing  bool
		finished bool
		pollCtx  context.Context
		cancel   context.CancelFunc
	}
}

// Name returns the task's name.
func (h *Handle) Name() string { return h.name }

// Wake returns a channel that receives a value whenever the engine has
// something for the task (a trigger, a note, closing). Tasks select on it
// wherever they block.
func (h *Handle) Wake() <-chan struct{} { return h.wake }

func (h *Handle) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
	h.mu.Lock()
	if h.mu.cancel != nil {
		h.mu.cancel()
		h.mu.cancel = nil
	}
	h.mu.Unlock()
}

func (h *Handle) trigger(id uint64, stop bool) {
	h.mu.Lock()
	h.mu.trigger, h.mu.stop = id, stop
	h.mu.Unlock()
	h.poke()
}

func (h *Handle) note(n Note) {
	h.mu.Lock()
	h.mu.notes = append(h.mu.notes, n)
	h.mu.Unlock()
	h.poke()
}

func (h *Handle) close() {
	h.mu.Lock()
	h.mu.closing = true
	h.mu.Unlock()
	h.poke()
}

// Trigger returns the pending checkpoint the task has not acknowledged yet;
// ok is false when there is none.
func (h *Handle) Trigger() (id uint64, stop bool, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.trigger > h.mu.acked {
		return h.mu.trigger, h.mu.stop, true
	}
	return 0, false, false
}

// Ack acknowledges checkpoint id. A task acknowledges each checkpoint at most
// once; acknowledging an id marks every older one acknowledged too.
func (h *Handle) Ack(id uint64, a Ack) {
	h.mu.Lock()
	if id <= h.mu.acked {
		h.mu.Unlock()
		return
	}
	h.mu.acked = id
	h.mu.Unlock()
	h.e.ack(h, id, a)
}

// RequestCheckpoint asks the coordinator for a checkpoint as soon as none
// is in flight (and Config.MinPause has passed), ahead of the interval:
// keyed tasks call it when their write-back state buffer outgrows its
// limit. It does not block; requests coalesce until the checkpoint starts.
func (h *Handle) RequestCheckpoint() {
	if !h.e.wanted.Swap(true) {
		h.e.signal()
	}
}

// Notes appends the pending notes (in checkpoint order) to dst and clears
// them.
func (h *Handle) Notes(dst []Note) []Note {
	h.mu.Lock()
	dst = append(dst, h.mu.notes...)
	h.mu.notes = h.mu.notes[:0]
	h.mu.Unlock()
	return dst
}

// Finish tells the engine that the task will process no more input. It
// keeps answering triggers (Ack) and notes until Closing.
func (h *Handle) Finish() {
	h.mu.Lock()
	if h.mu.finished {
		h.mu.Unlock()
		return
	}
	h.mu.finished = true
	h.mu.Unlock()
	h.e.mu.Lock()
	h.e.mu.finished++
	h.e.mu.Unlock()
	h.e.signal()
}

// Closing reports that the job is closing: the task should process its
// remaining notes and return nil.
func (h *Handle) Closing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.closing
}

// PollContext returns a context derived from parent that is cancelled as
// soon as the engine has something for the task, so that a source's
// blocking Poll returns promptly to inject a barrier. It is reused until
// cancelled.
func (h *Handle) PollContext(parent context.Context) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.pollCtx != nil && h.mu.cancel != nil && h.mu.pollCtx.Err() == nil {
		return h.mu.pollCtx
	}
	h.mu.pollCtx, h.mu.cancel = context.WithCancel(parent)
	if h.mu.trigger > h.mu.acked || len(h.mu.notes) > 0 || h.mu.closing {
		h.mu.cancel() // something is already waiting: do not block in Poll
	}
	return h.mu.pollCtx
}

// ReleasePollContext cancels the current poll context (call when the task
// ends).
func (h *Handle) ReleasePollContext() {
	h.mu.Lock()
	if h.mu.cancel != nil {
		h.mu.cancel()
		h.mu.cancel = nil
	}
	h.mu.Unlock()
}

// Resolved records sink transactions the task committed after a completed
// checkpoint; the next checkpoint drops them from the pending list.
func (h *Handle) Resolved(pcs ...checkpoint.PendingCommit) { h.e.Resolved(pcs...) }
