package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/source"
)

// SourceOption configures a source.
type SourceOption interface{ applySource(*sourceConfig) }

type sourceOptionFunc func(*sourceConfig)

func (f sourceOptionFunc) applySource(c *sourceConfig) { f(c) }

type sourceConfig struct {
	policy     *Policy
	validate   *bool
	outOfOrder time.Duration
	noWM       bool
	wmx        watermarkOptions // watermark.go
}

// OnBadRecord sets the source's policy for records that fail to decode or
// validate (default Fail).
func OnBadRecord(p Policy) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) { c.policy = &p })
}

// Validate turns go-playground/validator struct-tag validation of decoded
// records on or off. It is on by default for FromBytes and
// FromSourceDecoded when the record type is a struct (or a pointer to one),
// off for FromSource.
func Validate(on bool) SourceOption {
	return sourceOptionFunc(func(c *sourceConfig) { c.validate = &on })
}

// NoWatermarks disables the source's watermarks (event-time timers then
// fire only when the input ends).
func NoWatermarks() SourceOption { return sourceOptionFunc(func(c *sourceConfig) { c.noWM = true }) }

// FromSource adds a typed source. It runs one task per split.
func FromSource[T any](job *Job, uid string, src source.Source[T], opts ...SourceOption) *Stream[T] {
	return fromSource(job, uid, src, func(v T) (T, error) { return v, nil }, nil, false, opts)
}

// FromBytes adds a source of encoded records, decoded with codec (JSON[T]()
// for JSON) and then validated; records that fail either go to the source's
// bad-record policy with the raw bytes, split and offset.
func FromBytes[T any](job *Job, uid string, src source.Source[[]byte], codec Codec[T], opts ...SourceOption) *Stream[T] {
	if codec == nil {
		job.errorf("source %q: nil codec", uid)
	}
	return fromSource(job, uid, src, func(b []byte) (T, error) { return codec.Decode(b) }, func(b []byte) []byte { return b }, true, opts)
}

// FromSourceDecoded adds a source of S records converted to T by decode
// (and then validated), e.g. broker messages to events. A decode error goes
// to the source's bad-record policy.
func FromSourceDecoded[S, T any](job *Job, uid string, src source.Source[S], decode func(S) (T, error), opts ...SourceOption) *Stream[T] {
	if decode == nil {
		job.errorf("source %q: nil decode function", uid)
	}
	return fromSource(job, uid, src, decode, nil, true, opts)
}

func fromSource[S, T any](j *Job, uid string, src source.Source[S], decode func(S) (T, error), rawOf func(S) []byte, validateDefault bool, opts []SourceOption) *Stream[T] {
	n := j.addNode(uid, kindSource)
	n.src = src
	var cfg sourceConfig
	for _, o := range opts {
		o.applySource(&cfg)
	}
	n.policy = j.cfg.defaultSourcePol
	if cfg.policy != nil {
		n.policy = *cfg.policy
	}
	j.dlqNode(n.policy)
	validate := validateDefault
	if cfg.validate != nil {
		validate = *cfg.validate
	}
	validate = validate && validatable[T]()
	checkWatermarkOptions(j, uid, &cfg)
	out := &Stream[T]{n: n, ts: new(func(T) time.Time)}
	if src == nil {
		j.errorf("source %q is nil", uid)
	}
	n.binder = binderOf(src)
	var splits []source.Split
	n.taskCount = func(ctx context.Context, r *jobRun) (int, error) {
		if r.scope != nil && r.scope.head != n {
			return 0, nil // another scale-out stage's source
		}
		var err error
		if splits, err = src.Splits(ctx); err != nil {
			return 0, err
		}
		if r.scope != nil {
			// A scale-out task reads its own split only.
			i := slices.IndexFunc(splits, func(s source.Split) bool { return s.ID == r.scope.split })
			if i < 0 {
				return 0, fmt.Errorf("split %q of this task is not among the source's %d splits", r.scope.split, len(splits))
			}
			splits = splits[i : i+1]
		}
		seen := make(map[string]bool, len(splits))
		for _, s := range splits {
			if seen[s.ID] {
				return 0, fmt.Errorf("duplicate split %q", s.ID)
			}
			seen[s.ID] = true
		}
		return len(splits), nil
	}
	if d, ok := any(src).(source.Discoverer); ok {
		n.discover = discoverSplits(n, d, &splits)
	}
	n.startTask = func(r *jobRun, t *taskInfo) error {
		split := splits[t.subtask]
		b := newChainBuilder(r, t)
		b.meta.source, b.meta.split = uid, split.ID
		emit, err := outputs[T](b, n.outs)
		if err != nil {
			return err
		}
		wm, err := newSplitWatermarks(r.engine, uid, split.ID, &cfg, j.cfg.clock)
		if err != nil {
			return err
		}
		st := &sourceTask[S, T]{
			job: j, src: src, split: split, decode: decode, rawOf: rawOf, validate: validate,
			key: checkpoint.SplitKey(uid, split.ID), restored: r.engine.RestoredOffset(uid, split.ID),
			b: b, emit: emit, cnt: b.counter(n), reject: b.rejecterFor(n, uid, n.policy),
			tsOf: *out.ts, wm: wm, log: r.engine.Logger(), tr: newSourceTracer(r, uid, split.ID),
		}
		_, err = r.engine.AddTask(uid+"/"+split.ID, runtime.SourceTask, st.run)
		return err
	}
	return out
}

type sourceTask[S, T any] struct {
	job      *Job
	src      source.Source[S]
	split    source.Split
	decode   func(S) (T, error)
	rawOf    func(S) []byte
	validate bool
	key      string
	restored []byte
	b        *chainBuilder
	emit     emitFn[T]
	cnt      *counter
	reject   func(ctx context.Context, err error, v any, ts int64) error
	tsOf     func(T) time.Time
	wm       *splitWatermarks
	tr       *sourceTracer // hooks.go
	reader   source.SplitReader[S]
	// faulty: the OffsetsBeforeState failpoint is on: snapshots take the
	// offset before the last poll (prevOffset).
	faulty     bool
	prevOffset []byte
	log        interface {
		Warn(msg string, args ...any)
	}
}

func (st *sourceTask[S, T]) run(ctx context.Context, h *runtime.Handle) (err error) {
	defer recoverTask(&err)
	reader, err := st.src.Open(ctx, st.split, st.restored)
	if err != nil {
		return fmt.Errorf("open split %s: %w", st.split.ID, err)
	}
	st.reader = reader
	defer func() {
		if cerr := reader.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close split %s: %w", st.split.ID, cerr)
		}
	}()
	defer h.ReleasePollContext()
	ports := st.b.ports
	core := &taskCore{h: h, ports: ports, counters: st.b.flushCounters, cp: st}
	st.faulty = failpoint.Enabled && st.job.cfg.faults.OffsetsBeforeState
	if err := st.wm.start(ctx, ports); err != nil {
		return err
	}
	for {
		if done, err := core.beforePoll(ctx); done {
			return err
		}
		if st.faulty {
			st.prevOffset = reader.Offset()
		}
		pctx, cancel := st.wm.pollContext(h.PollContext(ctx))
		recs, perr := reader.Poll(pctx, batchSize)
		interrupted := pctx.Err() != nil
		cancel()
		st.tr.lag(reader)
		if len(recs) > 0 {
			if err := st.wm.beforeBatch(ctx, ports); err != nil {
				return err
			}
			if err := st.process(ctx, recs); err != nil {
				return err
			}
			if err := flushPorts(ctx, ports); err != nil {
				return err
			}
			if err := st.wm.emit(ctx, ports); err != nil {
				return err
			}
		} else if perr == nil || interrupted {
			if err := st.wm.quiet(ctx, ports); err != nil {
				return err
			}
		}
		switch {
		case perr == nil:
		case errors.Is(perr, source.ErrEndOfSplit):
			st.wm.ended()
			return core.end(ctx)
		case ctx.Err() != nil:
			return ctx.Err()
		case interrupted:
			// Poll interrupted to let the task inject a barrier or read notes.
		default:
			return fmt.Errorf("poll split %s: %w", st.split.ID, perr)
		}
	}
}

// snapshot implements checkpointed: the split's offset and watermark. The
// records read after it belong to the next checkpoint.
func (st *sourceTask[S, T]) snapshot(_ context.Context, id uint64) (runtime.Ack, error) {
	st.tr.barrier(id)
	off := st.reader.Offset()
	if st.faulty && st.prevOffset != nil {
		off = st.prevOffset
	}
	return runtime.Ack{Offsets: map[string][]byte{st.key: off}, Part: st.wm.part()}, nil
}

// note implements checkpointed: the reader learns of completed
// checkpoints. It never fails: the offsets are durable in the checkpoint;
// a failure is logged and counted (HookSourceNotify).
func (st *sourceTask[S, T]) note(ctx context.Context, n runtime.Note) error {
	if !n.Completed {
		return nil
	}
	err := st.reader.NotifyCheckpointComplete(ctx, n.ID)
	st.tr.hooks.onSourceNotify(st.tr.info.Source, st.split.ID, n.ID, err)
	if err != nil {
		st.log.Warn("source checkpoint notification failed", "split", st.key, "checkpoint", n.ID, "err", err)
	}
	return nil
}

func (st *sourceTask[S, T]) process(ctx context.Context, recs []source.Record[S]) error {
	var now int64
	b := st.b
	for i := range recs {
		rec := &recs[i]
		var ts int64
		if rec.EventTime.IsZero() {
			if now == 0 {
				now = st.job.cfg.clock().UnixNano()
			}
			ts = now
		} else {
			ts = rec.EventTime.UnixNano()
		}
		b.meta.offset, b.meta.raw = rec.Offset, rec.Raw
		st.cnt.in++
		if st.rawOf != nil && b.meta.raw == nil {
			b.meta.raw = st.rawOf(rec.Value)
		}
		rctx := st.tr.begin(ctx, b, &rec.Value) // ctx, or the record's traced context
		v, err := st.decode(rec.Value)
		if err != nil {
			err = &recordError{reason: ReasonDecode, err: err} // reasons.go
		} else if st.validate {
			if verr := st.job.cfg.validatorInstance.Struct(v); verr != nil {
				err = &recordError{reason: ReasonValidate, err: verr}
			}
		}
		if err != nil {
			err := st.reject(rctx, err, rec.Value, ts)
			st.tr.end(b, err)
			if err != nil {
				return err
			}
			continue
		}
		if st.tsOf != nil {
			ts = st.tsOf(v).UnixNano()
		}
		st.wm.onEvent(ts)
		st.cnt.out++
		err = st.emit(rctx, v, ts)
		st.tr.end(b, err)
		if err != nil {
			return err
		}
	}
	b.meta.offset, b.meta.raw = nil, nil
	b.flushCounters()
	return nil
}
