package pipeline

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
)

// Operator state: the non-keyed state of one subtask of a parallel stage
// (ProcessStream, the async I/O operators), as Flink's OperatorStateStore
// has it: named lists of elements that every checkpoint stores whole and
// a restore hands back, redistributed when the operator's parallelism
// changed:
//
//   - NewListState (Flink's getListState): even split. The elements of
//     every old subtask, in subtask order, are cut into Parallelism
//     contiguous runs of sizes that differ by one at most; subtask i gets
//     run i. At an unchanged parallelism every subtask gets its own list
//     back.
//   - NewUnionListState (getUnionListState): every subtask gets the
//     elements of every old subtask, in subtask order.
//
// Storage: under the operator's UID, key group 0, key 'o' name NUL
// subtask (4 bytes big-endian) index (4 bytes) for each element, and 'p'
// name for the parallelism that wrote them. A subtask's checkpoint part
// replaces its own elements (a range delete of its prefix, then the
// elements); subtask 0's also deletes those of subtasks at or beyond the
// current parallelism (a restore with fewer subtasks) and writes the
// parallelism. The parts of all subtasks go into the same checkpoint
// batch, so the lists always come from one checkpoint.

// OperatorStateStore holds one subtask's operator state lists. Register
// lists in the function's Open; they start with the subtask's share of
// the restored lists. It is used from the subtask's goroutine only.
type OperatorStateStore struct {
	eng      *runtime.Engine
	uid      string
	sub, par int
	lists    []opList
	restored map[string]*restoredList
	isRestor bool
}

// opList is a registered list: its name and its elements' encodings.
type opList interface {
	listName() string
	encode(dst [][]byte) ([][]byte, error)
}

// restoredList is one list as the latest checkpoint stored it.
type restoredList struct {
	par   int
	bySub map[int][][]byte
}

func newOperatorStateStore(eng *runtime.Engine, uid string, sub, par int) *OperatorStateStore {
	return &OperatorStateStore{eng: eng, uid: uid, sub: sub, par: par}
}

const (
	opStateElem = 'o'
	opStatePar  = 'p'
)

func opStatePrefix(dst []byte, name string) []byte {
	dst = append(dst, opStateElem)
	dst = append(dst, name...)
	return append(dst, 0)
}

func opStateSubPrefix(dst []byte, name string, sub int) []byte {
	return binary.BigEndian.AppendUint32(opStatePrefix(dst, name), uint32(sub))
}

// restore reads every list the latest checkpoint stored for the operator.
func (s *OperatorStateStore) restore() error {
	if s.eng == nil || !s.eng.Restored() {
		return nil
	}
	s.restored = make(map[string]*restoredList)
	get := func(name string) *restoredList {
		r := s.restored[name]
		if r == nil {
			r = &restoredList{bySub: make(map[int][][]byte)}
			s.restored[name] = r
		}
		return r
	}
	var bad error
	err := s.eng.Store().ScanState(s.uid, 0, nil, func(k, v []byte) bool {
		switch {
		case len(k) > 1 && k[0] == opStatePar && len(v) == 4:
			get(string(k[1:])).par = int(binary.BigEndian.Uint32(v))
		case len(k) > 1 && k[0] == opStateElem:
			i := bytes.IndexByte(k, 0)
			if i < 0 || len(k)-i-1 != 8 {
				bad = fmt.Errorf("malformed operator state key %q", k)
				return false
			}
			r := get(string(k[1:i]))
			sub := int(binary.BigEndian.Uint32(k[i+1:]))
			r.bySub[sub] = append(r.bySub[sub], bytes.Clone(v))
		default:
			bad = fmt.Errorf("malformed operator state key %q", k)
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	if bad != nil {
		return bad
	}
	s.isRestor = true
	return nil
}

// share returns this subtask's share of the restored list name.
func (s *OperatorStateStore) share(name string, union bool) [][]byte {
	r := s.restored[name]
	if r == nil {
		return nil
	}
	if !union && r.par == s.par {
		return r.bySub[s.sub]
	}
	subs := make([]int, 0, len(r.bySub))
	for sub := range r.bySub {
		subs = append(subs, sub)
	}
	slices.Sort(subs)
	var all [][]byte
	for _, sub := range subs {
		all = append(all, r.bySub[sub]...)
	}
	if union {
		return all
	}
	start, end := evenSplit(len(all), s.par, s.sub)
	return all[start:end]
}

// evenSplit returns the run [start, end) of n elements that subtask sub of
// par gets: par contiguous runs whose sizes differ by one at most, the
// longer ones first.
func evenSplit(n, par, sub int) (start, end int) {
	base, rem := n/par, n%par
	start = sub*base + min(sub, rem)
	end = start + base
	if sub < rem {
		end++
	}
	return start, end
}

func (s *OperatorStateStore) register(l opList) error {
	name := l.listName()
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("pipeline: operator state name %q: empty or with a NUL byte", name)
	}
	for _, o := range s.lists {
		if o.listName() == name {
			return fmt.Errorf("pipeline: operator state %q registered twice", name)
		}
	}
	s.lists = append(s.lists, l)
	return nil
}

// part encodes every list for a checkpoint (nil when none is registered).
func (s *OperatorStateStore) part() (checkpoint.Part, error) {
	if len(s.lists) == 0 {
		return nil, nil
	}
	p := &opStatePart{uid: s.uid, sub: s.sub, par: s.par, lists: make([]encodedList, len(s.lists))}
	for i, l := range s.lists {
		elems, err := l.encode(nil)
		if err != nil {
			return nil, fmt.Errorf("operator state %q: %w", l.listName(), err)
		}
		p.lists[i] = encodedList{name: l.listName(), elems: elems}
	}
	return p, nil
}

type encodedList struct {
	name  string
	elems [][]byte
}

// opStatePart writes one subtask's lists into a checkpoint.
type opStatePart struct {
	uid      string
	sub, par int
	lists    []encodedList
}

func (p *opStatePart) WriteTo(w *checkpoint.Writer) error {
	var key []byte
	for _, l := range p.lists {
		key = opStateSubPrefix(key[:0], l.name, p.sub)
		if err := w.DeleteStateRange(p.uid, 0, key, nil); err != nil {
			return err
		}
		n := len(key)
		for i, e := range l.elems {
			key = binary.BigEndian.AppendUint32(key[:n], uint32(i))
			if err := w.PutState(p.uid, 0, key, e); err != nil {
				return err
			}
		}
		if p.sub != 0 {
			continue
		}
		// Subtask 0: the elements of subtasks beyond the parallelism go
		// (a restore with fewer subtasks), and the parallelism is noted.
		from := opStateSubPrefix(nil, l.name, p.par)
		to := opStatePrefix(nil, l.name)
		to[len(to)-1] = 1
		if err := w.DeleteStateRange(p.uid, 0, from, to); err != nil {
			return err
		}
		pk := append([]byte{opStatePar}, l.name...)
		if err := w.PutState(p.uid, 0, pk, binary.BigEndian.AppendUint32(nil, uint32(p.par))); err != nil {
			return err
		}
	}
	return nil
}

// ListState is a list of operator state (see OperatorStateStore): its
// content when a checkpoint is taken is what the checkpoint stores. Not
// safe for concurrent use.
type ListState[T any] struct {
	name  string
	codec Codec[T]
	items []T
}

// NewListState registers the list state name on s, encoded with codec
// (JSON[T]() for JSON): on a restore it starts with this subtask's even
// share of the stored elements (Flink's getListState).
func NewListState[T any](s *OperatorStateStore, name string, codec Codec[T]) (*ListState[T], error) {
	return newListState(s, name, codec, false)
}

// NewUnionListState registers the list state name on s: on a restore
// every subtask starts with all the stored elements, of every subtask
// (Flink's getUnionListState). Each subtask's list is stored separately:
// a subtask that keeps the whole union after a restore stores it again,
// so keep only your own part.
func NewUnionListState[T any](s *OperatorStateStore, name string, codec Codec[T]) (*ListState[T], error) {
	return newListState(s, name, codec, true)
}

func newListState[T any](s *OperatorStateStore, name string, codec Codec[T], union bool) (*ListState[T], error) {
	if codec == nil {
		return nil, fmt.Errorf("pipeline: operator state %q: nil codec", name)
	}
	l := &ListState[T]{name: name, codec: codec}
	if err := s.register(l); err != nil {
		return nil, err
	}
	for _, b := range s.share(name, union) {
		v, err := codec.Decode(b)
		if err != nil {
			return nil, fmt.Errorf("pipeline: operator state %q: %w", name, err)
		}
		l.items = append(l.items, v)
	}
	return l, nil
}

func (l *ListState[T]) listName() string { return l.name }

func (l *ListState[T]) encode(dst [][]byte) ([][]byte, error) {
	for _, v := range l.items {
		b, err := l.codec.Append(nil, v)
		if err != nil {
			return nil, err
		}
		dst = append(dst, b)
	}
	return dst, nil
}

// Get returns the list's elements (the list's own slice: valid until the
// next change).
func (l *ListState[T]) Get() []T { return l.items }

// Add appends vs.
func (l *ListState[T]) Add(vs ...T) { l.items = append(l.items, vs...) }

// Update replaces the elements with (a copy of) vs.
func (l *ListState[T]) Update(vs []T) { l.items = append(l.items[:0], vs...) }

// Clear removes every element.
func (l *ListState[T]) Clear() { clear(l.items); l.items = l.items[:0] }

// rawList is an internal list of encoded elements (the async operators'
// requests in flight).
type rawList struct {
	name  string
	elems [][]byte
}

func (l *rawList) listName() string { return l.name }

func (l *rawList) encode(dst [][]byte) ([][]byte, error) { return append(dst, l.elems...), nil }

// ProcessFunc is a non-keyed operator's user code (ProcessStream, Flink's
// ProcessFunction on a non-keyed stream): one instance per subtask, called
// from the subtask's goroutine only. Its state is operator state,
// registered in Open on ctx.OperatorState().
//
// A ProcessFunc may also implement CheckpointedFunc (SnapshotState,
// called before every checkpoint stores its lists) and Close() error
// (called when the subtask ends).
type ProcessFunc[T, U any] interface {
	Open(ctx *OperatorContext) error
	ProcessElement(ctx *ProcessContext[U], v T) error
}

// CheckpointedFunc is implemented by functions that update their operator
// state lists just before a checkpoint stores them (Flink's
// CheckpointedFunction.snapshotState).
type CheckpointedFunc interface {
	SnapshotState(checkpointID uint64) error
}

// OperatorContext is given to ProcessFunc.Open.
type OperatorContext struct {
	state    *OperatorStateStore
	sub, par int
	log      *slog.Logger
}

// OperatorState returns the subtask's operator state store.
func (o *OperatorContext) OperatorState() *OperatorStateStore { return o.state }

// Restored reports whether the job was restored from a checkpoint.
func (o *OperatorContext) Restored() bool { return o.state.isRestor }

// Subtask returns the subtask's index.
func (o *OperatorContext) Subtask() int { return o.sub }

// Parallelism returns the operator's number of subtasks.
func (o *OperatorContext) Parallelism() int { return o.par }

// Logger returns the job's logger.
func (o *OperatorContext) Logger() *slog.Logger { return o.log }

// ProcessContext is given to ProcessFunc.ProcessElement; valid only during
// the call.
type ProcessContext[U any] struct {
	ctx  context.Context
	ts   int64
	wm   int64
	next emitFn[U]
	cnt  *counter
}

// Context returns the task's context (done when the job stops).
func (c *ProcessContext[U]) Context() context.Context { return c.ctx }

// Timestamp returns the record's event time.
func (c *ProcessContext[U]) Timestamp() time.Time { return time.Unix(0, c.ts) }

// Watermark returns the subtask's current watermark (Unix nanoseconds;
// math.MinInt64 before the first).
func (c *ProcessContext[U]) Watermark() int64 { return c.wm }

// Emit passes v downstream with the record's event time.
func (c *ProcessContext[U]) Emit(v U) error {
	c.cnt.out++
	return c.next(c.ctx, v, c.ts)
}

// ProcessStream runs a ProcessFunc (one per subtask, from newFn) on s, in
// Parallelism subtasks (default DefaultParallelism) fed as by Rebalance. Its operator state is checkpointed under uid and
// redistributed on a restore with another parallelism (see
// NewListState, NewUnionListState). It runs in one process (see
// ErrSingleProcessOnly).
func ProcessStream[T, U any](s *Stream[T], uid string, newFn func() ProcessFunc[T, U], opts ...OperatorOption) *Stream[U] {
	if newFn == nil {
		s.n.job.errorf("ProcessStream %q: nil function constructor", uid)
	}
	return parallelStage[T, U](s, uid, kindOpProcess, opts, func(e *stageEnv) (stageOp[T], error) {
		next, err := outputs[U](e.b, e.n.outs)
		if err != nil {
			return nil, err
		}
		op := &processOp[T, U]{env: e, newFn: newFn}
		op.pctx = &ProcessContext[U]{next: next, cnt: e.cnt, wm: minWatermark}
		return op, nil
	})
}

const minWatermark = -1 << 63

type processOp[T, U any] struct {
	env   *stageEnv
	newFn func() ProcessFunc[T, U]
	fn    ProcessFunc[T, U]
	pctx  *ProcessContext[U]
}

func (o *processOp[T, U]) open(ctx context.Context) error {
	o.fn = o.newFn()
	oc := &OperatorContext{state: o.env.state, sub: o.env.sub, par: o.env.par, log: o.env.b.r.job.cfg.logger}
	o.pctx.ctx = ctx
	return protectErr(func(f ProcessFunc[T, U], oc *OperatorContext) error { return f.Open(oc) }, o.fn, oc)
}

func (o *processOp[T, U]) process(ctx context.Context, v T, ts int64) error {
	o.pctx.ctx, o.pctx.ts = ctx, ts
	if err := callErr(ctx, o.env.n.retry, o.fn.ProcessElement, o.pctx, v); err != nil {
		return o.env.reject(ctx, err, v, ts)
	}
	return nil
}

func (o *processOp[T, U]) watermark(ctx context.Context, wm int64) error {
	if wm > activeNoWatermark {
		o.pctx.wm = wm
	}
	return watermarkPorts(ctx, o.env.b.ports, wm)
}

func (o *processOp[T, U]) events() <-chan struct{}       { return nil }
func (o *processOp[T, U]) onEvent(context.Context) error { return nil }
func (o *processOp[T, U]) timer() <-chan time.Time       { return nil }
func (o *processOp[T, U]) onTimer(context.Context) error { return nil }
func (o *processOp[T, U]) pending() bool                 { return false }
func (o *processOp[T, U]) stopped()                      {}

func (o *processOp[T, U]) snapshot(id uint64) error {
	if c, ok := o.fn.(CheckpointedFunc); ok {
		return protectErr(func(c CheckpointedFunc, id uint64) error { return c.SnapshotState(id) }, c, id)
	}
	return nil
}

func (o *processOp[T, U]) close() error {
	if c, ok := o.fn.(interface{ Close() error }); ok && o.fn != nil {
		return protectErr(func(c interface{ Close() error }, _ struct{}) error { return c.Close() }, c, struct{}{})
	}
	return nil
}

// OperatorStateful is implemented by sinks that keep operator state
// (Flink's CheckpointedFunction on a sink): InitializeState is called
// when the sink's task starts, with its lists restored (a sink runs in one
// task: its lists come back whole, even split or union alike);
// SnapshotState before every checkpoint stores them, after the sink's
// Flush or PreCommit for that checkpoint. Both run on the sink's task
// goroutine. The state is stored under the sink's UID.
type OperatorStateful interface {
	InitializeState(ctx *OperatorContext) error
	SnapshotState(checkpointID uint64) error
}

// sinkOperatorState returns the operator state store of sink sk (nil when
// it keeps none).
func sinkOperatorState(eng *runtime.Engine, uid string, sk any) *OperatorStateStore {
	if _, ok := sk.(OperatorStateful); !ok {
		return nil
	}
	return newOperatorStateStore(eng, uid, 0, 1)
}

func (st *sinkTask[T]) initOpState() error {
	if st.ops == nil {
		return nil
	}
	if err := st.ops.restore(); err != nil {
		return fmt.Errorf("sink %q: restore operator state: %w", st.uid, err)
	}
	oc := &OperatorContext{state: st.ops, sub: 0, par: 1, log: st.n.job.cfg.logger}
	f := st.sk.(OperatorStateful)
	if err := protectErr(func(f OperatorStateful, oc *OperatorContext) error { return f.InitializeState(oc) }, f, oc); err != nil {
		return fmt.Errorf("sink %q: initialize state: %w", st.uid, err)
	}
	return nil
}

func (st *sinkTask[T]) snapshotOpState(id uint64) (checkpoint.Part, error) {
	f := st.sk.(OperatorStateful)
	if err := protectErr(func(f OperatorStateful, id uint64) error { return f.SnapshotState(id) }, f, id); err != nil {
		return nil, fmt.Errorf("sink %q: snapshot state: %w", st.uid, err)
	}
	return st.ops.part()
}
