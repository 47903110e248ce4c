package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Hook is a value that implements one or more of the Hook* interfaces of
// this package. Hooks are listed in Config.Hooks (pipeline.Hooks for jobs);
// the Engine and package pipeline type-assert each one once, so a hook pays
// only for the interfaces it implements and new interfaces never break
// existing hooks (franz-go's kgo.Hook). Hooks are called synchronously, on
// the goroutine each interface names; they must not block and must be safe
// for concurrent use. Package otel implements them with OpenTelemetry.
type Hook any

// HookJobStart is called by Engine.Run, on Run's goroutine, before any task
// starts, with the job's read-only view. The view may be kept and read from
// any goroutine (a metrics collection) until HookJobEnd.
type HookJobStart interface {
	OnJobStart(job JobView)
}

// HookJobEnd is called by Engine.Run, on Run's goroutine, after every task
// returned, with the job's view (equal to the one HookJobStart got) and
// Run's error (nil for a clean end).
type HookJobEnd interface {
	OnJobEnd(job JobView, err error)
}

// JobView is the read-only view of a running job that hooks receive: its
// name, status, split gauges and backpressure, the figures the status
// endpoint and package otel report. It carries no way to change the job
// (no task registration, no savepoints). The views of one job compare
// equal, so a hook can key per-job state by its view. The zero JobView is
// invalid. Its methods are safe for concurrent use; after the job ended
// they return its last figures.
type JobView struct{ e *Engine }

// Name returns the job's name.
func (v JobView) Name() string { return v.e.cfg.Name }

// Status returns a snapshot of the job's status (the Status of the status
// endpoint: operators' counters and watermarks, committed offsets, recent
// checkpoints).
func (v JobView) Status() Status { return v.e.Status() }

// Splits returns a snapshot of the source splits' gauges (lag, watermark,
// idleness), sorted by source and split. A Lag of -1 is unknown.
func (v JobView) Splits() []SplitLag { return v.e.splitLags() }

// Backpressure returns a snapshot of the time each operator's tasks spent
// blocked sending records downstream (full input queues of the next task),
// by operator UID.
func (v JobView) Backpressure() map[string]time.Duration { return v.e.backpressureAll() }

// CheckpointKind says why a checkpoint was taken.
type CheckpointKind uint8

// Checkpoint kinds.
const (
	// CheckpointPeriodic is a checkpoint of the configured interval.
	CheckpointPeriodic CheckpointKind = iota
	// CheckpointStop is the checkpoint of a job stopping (Run's ctx done).
	CheckpointStop
	// CheckpointFinal is the checkpoint of a bounded job that drained.
	CheckpointFinal
)

// String returns "periodic", "stop" or "final".
func (k CheckpointKind) String() string {
	switch k {
	case CheckpointStop:
		return "stop"
	case CheckpointFinal:
		return "final"
	}
	return "periodic"
}

// HookCheckpointBegin is called by the coordinator goroutine when it
// triggers checkpoint id, before any task is asked for it.
type HookCheckpointBegin interface {
	OnCheckpointBegin(job string, id uint64, kind CheckpointKind, start time.Time)
}

// CheckpointInfo describes a checkpoint that ended.
type CheckpointInfo struct {
	ID   uint64
	Kind CheckpointKind
	// Start is when it was triggered; Duration how long it took until it
	// was committed, failed or timed out.
	Start    time.Time
	Duration time.Duration
	// Bytes is the size of the committed batch (0 when it failed).
	Bytes int64
	// Offsets is the number of split offsets, SinkTxns the number of sink
	// transactions pre-committed for it, StateChanges the state entries it
	// wrote (all as acknowledged, also when the commit failed).
	Offsets, SinkTxns, StateChanges int
	// Err is nil when the checkpoint completed (durable); else why not.
	Err error
}

// HookCheckpointEnd is called by the coordinator goroutine when checkpoint
// info.ID completed (info.Err nil), failed or timed out, before the tasks
// are told.
type HookCheckpointEnd interface {
	OnCheckpointEnd(job string, info CheckpointInfo)
}

// HookSinkCommit is called by a sink task after it committed (or failed to
// commit) the transaction it pre-committed for a checkpoint.
type HookSinkCommit interface {
	OnSinkCommit(job, sink string, checkpointID uint64, took time.Duration, err error)
}

// HookSourceNotify is called by a source task after it told a split's
// reader that a checkpoint completed (source.SplitReader's
// NotifyCheckpointComplete: e.g. reporting the checkpointed offsets to the
// broker for lag tools), with the reader's error. Such a failure does not
// fail the job (the offsets are durable in the checkpoint already); the
// task logs it and this hook lets it be counted.
type HookSourceNotify interface {
	OnSourceNotify(job, source, split string, checkpointID uint64, err error)
}

// HookDeadLetter is called by the task that rejected a record (a Skip or
// DeadLetter policy), on that task's goroutine. reason is a short,
// low-cardinality class: "decode" (a source record could not be decoded),
// "validate" (a decoded record failed validation), "process" (a user
// function failed), "panic" (a user function panicked) or "late" (a record
// behind the operator's watermark sent to dead letters); policy is "skip"
// or "dead-letter".
type HookDeadLetter interface {
	OnDeadLetter(job, operator, reason, policy string)
}

// RecordInfo describes a record a source task read, for HookRecord.
type RecordInfo struct {
	Job, Source, Split string
	// Value points to the source record as the source returned it (e.g. a
	// *rocketmq.Message, whose properties carry the producer's trace
	// context). It is valid only during StartRecord and must not be kept.
	Value any
	// AfterCheckpoint is the last checkpoint whose barrier the split's task
	// injected before this record: the record's effects are durable once a
	// checkpoint with a larger ID completes.
	AfterCheckpoint uint64
}

// HookRecord is called by a source task for every record it read, on the
// task's goroutine, before the record is decoded. It returns nil when the
// record is not traced: that must be cheap (no allocation), since it runs
// for every record. A non-nil RecordTrace follows the record through the
// operators of the job, across tasks.
type HookRecord interface {
	StartRecord(ctx context.Context, r *RecordInfo) RecordTrace
}

// RecordTrace follows one traced record through a job. Its methods are
// called on the goroutines of the tasks holding the record, and may be
// called concurrently: a record (or what a handler emitted for it) sent to
// several keyed subtasks, or to a sink and a KeyBy at once, starts operator
// spans from several tasks. Implementations must be safe for concurrent use.
type RecordTrace interface {
	// Context returns parent carrying the record's trace context, handed to
	// user functions (and sinks) that process the record.
	Context(parent context.Context) context.Context
	// StartOperator is called before operator uid (of kind: map, filter,
	// flatmap, process, sink …) processes the record; the returned end is
	// called with the operator's outcome. ctx is from Context (or an
	// enclosing StartOperator); the returned ctx is given to the user
	// function.
	StartOperator(ctx context.Context, uid, kind string) (context.Context, func(error))
	// End is called by the source task once the record's processing in its
	// task ended (err: the first failure).
	End(err error)
}

// HookMetricsHandler provides the handler Config.MetricsAddr serves on
// /metrics (Prometheus text format).
type HookMetricsHandler interface {
	MetricsHandler() http.Handler
}

// SplitStats are one source split's gauges, updated by its task (see
// Engine.Split) and read by the status endpoint and hooks (JobView.Splits).
type SplitStats struct {
	Source, Split string
	// Lag is the number of records the split is behind the end of its
	// partition (for broker queues: the broker's max offset minus the
	// offset of the last completed checkpoint), -1 when unknown.
	Lag atomic.Int64
	// Watermark is the split's last event-time watermark (Unix
	// nanoseconds), NoWatermark while it has none.
	Watermark atomic.Int64
	// Idle is set while the split is marked idle (no record for its idle
	// timeout): it then holds no watermark back.
	Idle atomic.Bool
}

// hooks are the type-asserted hooks of an Engine, plus its observability
// registries.
type hooks struct {
	start   []HookJobStart
	end     []HookJobEnd
	cpBegin []HookCheckpointBegin
	cpEnd   []HookCheckpointEnd
	metrics http.Handler
	ln      net.Listener

	mu struct {
		sync.Mutex
		splits  []*SplitStats
		blocked map[string]*atomic.Int64
	}
}

func (h *hooks) init(list []Hook) {
	for _, x := range list {
		if v, ok := x.(HookJobStart); ok {
			h.start = append(h.start, v)
		}
		if v, ok := x.(HookJobEnd); ok {
			h.end = append(h.end, v)
		}
		if v, ok := x.(HookCheckpointBegin); ok {
			h.cpBegin = append(h.cpBegin, v)
		}
		if v, ok := x.(HookCheckpointEnd); ok {
			h.cpEnd = append(h.cpEnd, v)
		}
		if v, ok := x.(HookMetricsHandler); ok && h.metrics == nil {
			h.metrics = v.MetricsHandler()
		}
	}
}

// initHooks type-asserts cfg.Hooks and opens the metrics listener.
func (e *Engine) initHooks() error {
	e.obs.init(e.cfg.Hooks)
	if e.cfg.MetricsAddr == "" {
		return nil
	}
	if e.obs.metrics == nil {
		return fmt.Errorf("%w: a metrics address needs a hook providing the metrics handler (HookMetricsHandler)", ErrInvalidConfig)
	}
	ln, err := net.Listen("tcp", e.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("runtime: metrics endpoint: %w", err)
	}
	e.obs.ln = ln
	return nil
}

// closeMetricsListener closes a metrics listener that was never served.
func (e *Engine) closeMetricsListener() {
	if e.obs.ln != nil {
		_ = e.obs.ln.Close() // never served: nothing to report
	}
}

// MetricsAddr returns the metrics endpoint's address, or "" when disabled.
func (e *Engine) MetricsAddr() string {
	if e.obs.ln == nil {
		return ""
	}
	return e.obs.ln.Addr().String()
}

// startHooks runs the start hooks and the metrics server (joined by wg); it
// returns the functions that stop the server and that run the end hooks.
func (e *Engine) startHooks(wg *sync.WaitGroup) (stopServer func(), end func(err error)) {
	for _, h := range e.obs.start {
		h.OnJobStart(JobView{e})
	}
	var srv *http.Server
	if e.obs.ln != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", e.obs.metrics)
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		ln := e.obs.ln
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				e.log.Warn("metrics endpoint stopped", "job", e.cfg.Name, "err", err)
			}
		})
	}
	stopServer = func() {
		if srv != nil {
			_ = srv.Close() // stops Serve, joined by the caller's wg
		}
	}
	return stopServer, func(err error) {
		for _, h := range e.obs.end {
			h.OnJobEnd(JobView{e}, err)
		}
	}
}

func (e *Engine) checkpointBegin(cp *inflight) {
	for _, h := range e.obs.cpBegin {
		h.OnCheckpointBegin(e.cfg.Name, cp.id, cp.kind(), cp.started)
	}
}

func (cp *inflight) kind() CheckpointKind {
	switch {
	case cp.stop:
		return CheckpointStop
	case cp.final:
		return CheckpointFinal
	}
	return CheckpointPeriodic
}

// checkpointEnd runs the end hooks for cp (called by the coordinator after
// the commit, the failure or the timeout was recorded).
func (e *Engine) checkpointEnd(cp *inflight, err error) {
	if len(e.obs.cpEnd) == 0 {
		return
	}
	info := CheckpointInfo{ID: cp.id, Kind: cp.kind(), Start: cp.started, Duration: time.Since(cp.started), Err: err}
	e.mu.Lock()
	for _, a := range cp.acks {
		info.Offsets += len(a.Offsets)
		info.SinkTxns += len(a.Pending)
	}
	if n := len(e.mu.history); n > 0 && e.mu.history[n-1].ID == cp.id {
		last := e.mu.history[n-1]
		info.Duration, info.StateChanges = last.Duration, last.StateChanges
		if err == nil {
			info.Bytes = last.Bytes
		}
	}
	e.mu.Unlock()
	for _, h := range e.obs.cpEnd {
		h.OnCheckpointEnd(e.cfg.Name, info)
	}
}

// Split registers (or returns the registered) stats of a source split. Its
// Lag starts unknown (-1), its Watermark at NoWatermark.
func (e *Engine) Split(source, split string) *SplitStats {
	e.obs.mu.Lock()
	defer e.obs.mu.Unlock()
	for _, s := range e.obs.mu.splits {
		if s.Source == source && s.Split == split {
			return s
		}
	}
	s := &SplitStats{Source: source, Split: split}
	s.Lag.Store(-1)
	s.Watermark.Store(NoWatermark)
	e.obs.mu.splits = append(e.obs.mu.splits, s)
	return s
}

// splitStats returns the registered splits' stats, sorted by source and
// split. The pointers stay valid (and updated) while the job runs.
func (e *Engine) splitStats() []*SplitStats {
	e.obs.mu.Lock()
	out := append([]*SplitStats(nil), e.obs.mu.splits...)
	e.obs.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Source != out[j].Source {
			return out[i].Source < out[j].Source
		}
		return out[i].Split < out[j].Split
	})
	return out
}

// Backpressure returns the counter of the nanoseconds operator uid's tasks
// spent blocked sending records downstream (full input queues of the next
// task), registering it on first use.
func (e *Engine) Backpressure(uid string) *atomic.Int64 {
	e.obs.mu.Lock()
	defer e.obs.mu.Unlock()
	if e.obs.mu.blocked == nil {
		e.obs.mu.blocked = make(map[string]*atomic.Int64)
	}
	c, ok := e.obs.mu.blocked[uid]
	if !ok {
		c = new(atomic.Int64)
		e.obs.mu.blocked[uid] = c
	}
	return c
}

// splitLags returns a snapshot of the splits' gauges, sorted by source and
// split.
func (e *Engine) splitLags() []SplitLag {
	stats := e.splitStats()
	out := make([]SplitLag, 0, len(stats))
	for _, s := range stats {
		out = append(out, SplitLag{Source: s.Source, Split: s.Split, Lag: s.Lag.Load(),
			Watermark: wmTime(s.Watermark.Load()), Idle: s.Idle.Load()})
	}
	return out
}

// backpressureAll returns a snapshot of every operator's backpressure time
// (see Backpressure), by operator UID.
func (e *Engine) backpressureAll() map[string]time.Duration {
	e.obs.mu.Lock()
	defer e.obs.mu.Unlock()
	out := make(map[string]time.Duration, len(e.obs.mu.blocked))
	for uid, c := range e.obs.mu.blocked {
		out[uid] = time.Duration(c.Load())
	}
	return out
}
