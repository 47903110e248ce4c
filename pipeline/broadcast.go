package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
)

// Broadcast state.
//
// A broadcast input (Broadcast, then ProcessBroadcast or
// ProcessKeyedBroadcast) reaches every subtask of its operator: each
// subtask's port sends a broadcast record to every subtask's inbox, in
// order with that task's other records, so at barrier n every subtask has
// seen the same broadcast records (those before barrier n on each sending
// task). The subtasks keep the broadcast state in memory, every subtask a
// full copy. Subtask 0 writes it into the checkpoints (the whole state,
// when it changed since the last completed checkpoint) under the
// operator's UID in key group broadcastKeyGroup, outside every keyed
// range; every subtask loads that one copy when it starts. So every
// subtask restores the same state, whatever the parallelism before and
// after. As in Flink, the order in which broadcast records from several
// sending tasks interleave may differ between subtasks: updates that do
// not commute make their copies differ, and a restore then gives every
// subtask subtask 0's.

var (
	// ErrBroadcastReadOnly is returned by BroadcastMap's Put and Delete
	// outside ProcessBroadcastElement: the non-broadcast side only reads
	// broadcast state.
	ErrBroadcastReadOnly = errors.New("pipeline: broadcast state is read-only outside ProcessBroadcastElement")
	// ErrBroadcastScaleout is returned (wrapped in ErrInvalidGraph) by
	// RunWorker for a job with a broadcast operator: a job on many workers
	// partitions every keyed operator's input by key range, and a
	// broadcast input would have to reach every range's task. Run such a
	// job in one process (Job.Run).
	ErrBroadcastScaleout = errors.New("pipeline: a broadcast input does not run on many workers (RunWorker): run the job in one process")
)

// broadcastKeyGroup is the key group under which broadcast state is
// stored: above every real one (state.MaxMaxParallelism is 1<<15).
const broadcastKeyGroup = 0xffff

// BroadcastStream is a stream sent to every subtask of the operator it is
// connected to (ProcessBroadcast, ProcessKeyedBroadcast). Meant for low
// volumes: rules, configuration, reference data.
type BroadcastStream[B any] struct{ s *Stream[B] }

// Broadcast marks s for broadcasting.
func Broadcast[B any](s *Stream[B]) *BroadcastStream[B] { return &BroadcastStream[B]{s: s} }

// BroadcastProcessFunc is the user code of a non-keyed operator with a
// broadcast input (ProcessBroadcast; Flink's BroadcastProcessFunction).
// One instance per subtask, called from its goroutine only. It registers
// its broadcast state in Open (NewBroadcastMap).
type BroadcastProcessFunc[A, B, U any] interface {
	Open(ctx *OpenContext) error
	// ProcessElement handles a record of the non-broadcast input: broadcast
	// state is read-only here.
	ProcessElement(ctx *Context[U], a A) error
	// ProcessBroadcastElement handles a broadcast record (every subtask
	// gets each one): it may change broadcast state.
	ProcessBroadcastElement(ctx *Context[U], b B) error
}

// KeyedBroadcastProcessFunc is the user code of a keyed operator with a
// broadcast input (ProcessKeyedBroadcast; Flink's
// KeyedBroadcastProcessFunction). ProcessElement and OnTimer have the
// current key's state and timers and read broadcast state;
// ProcessBroadcastElement has no current key (keyed state handles and
// timers return state.ErrNoCurrentKey there) and may change broadcast
// state.
type KeyedBroadcastProcessFunc[K comparable, A, B, U any] interface {
	Open(ctx *OpenContext) error
	ProcessElement(ctx *KeyedContext[K, U], a A) error
	ProcessBroadcastElement(ctx *Context[U], b B) error
	OnTimer(ctx *KeyedContext[K, U], t Timer) error
}

// ProcessBroadcast runs a non-keyed operator over s with bc broadcast to
// every subtask: s's records are spread round robin over Parallelism
// subtasks (default DefaultParallelism). A job with a broadcast input runs
// in one process only (ErrBroadcastScaleout).
func ProcessBroadcast[A, B, U any](s *Stream[A], bc *BroadcastStream[B], uid string, newFn func() BroadcastProcessFunc[A, B, U], opts ...OperatorOption) *Stream[U] {
	if newFn == nil {
		s.n.job.errorf("ProcessBroadcast %q: nil function constructor", uid)
	}
	u := tagUnion(s, bc.s, uid, true)
	k := KeyBy(u, func(e Either[A, B]) uint32 { return e.rr }).WithCodec(EitherCodec(JSON[A](), JSON[B]()))
	k.all = isSecond[A, B]
	sh := &broadcastShared{}
	out := keyedOp(k, uid, kindProcess, "op=broadcast-process", func() KeyedProcessFunc[uint32, Either[A, B], U] {
		return &broadcastAdapter[A, B, U]{fn: newFn(), st: sh.newState(uid)}
	}, opts)
	sh.attach(out.n)
	return out
}

// ProcessKeyedBroadcast runs a keyed operator over k with bc broadcast to
// every subtask. A job with a broadcast input runs in one process only
// (ErrBroadcastScaleout).
func ProcessKeyedBroadcast[K comparable, A, B, U any](k *KeyedStream[K, A], bc *BroadcastStream[B], uid string, newFn func() KeyedBroadcastProcessFunc[K, A, B, U], opts ...OperatorOption) *Stream[U] {
	if newFn == nil {
		k.s.n.job.errorf("ProcessKeyedBroadcast %q: nil function constructor", uid)
	}
	u := tagUnion(k.s, bc.s, uid, false)
	key := k.key
	tk := &KeyedStream[K, Either[A, B]]{
		s: u, codec: k.codec, vcodec: EitherCodec(recordCodec(k), JSON[B]()), all: isSecond[A, B],
		key: func(e Either[A, B]) K {
			if e.Second {
				var z K
				return z // sent to every subtask; no current key there
			}
			return key(e.A)
		},
	}
	sh := &broadcastShared{}
	out := keyedOp(tk, uid, kindProcess, "op=keyed-broadcast-process", func() KeyedProcessFunc[K, Either[A, B], U] {
		return &keyedBroadcastAdapter[K, A, B, U]{fn: newFn(), st: sh.newState(uid)}
	}, opts)
	sh.attach(out.n)
	return out
}

func isSecond[A, B any](e Either[A, B]) bool { return e.Second }

// broadcastShared is what a broadcast operator's subtasks share: the
// run's checkpoint store, known once the run sets the node up.
type broadcastShared struct{ store *checkpoint.Store }

func (sh *broadcastShared) attach(n *node) {
	n.broadcast = true
	setup := n.setup
	n.setup = func(r *jobRun) error {
		sh.store = r.engine.Store()
		return setup(r)
	}
}

func (sh *broadcastShared) newState(uid string) *broadcastState {
	return &broadcastState{sh: sh, uid: uid, maps: map[string]*bmap{}}
}

// emitAll sends r, whose key encodes to kb, to every subtask (a broadcast
// record).
func (p *keyedPort[K, T]) emitAll(ctx context.Context, r krec[K, T], kb []byte) error {
	for sub := range p.ins {
		n, err := p.add(sub, r, kb)
		if err != nil {
			return err
		}
		if n >= batchSize {
			if err := p.send(ctx, sub); err != nil {
				return err
			}
		}
	}
	return nil
}

// broadcastState is one subtask's broadcast state: its goroutine only,
// except the Parts it returns (immutable copies).
type broadcastState struct {
	sh       *broadcastShared
	uid      string
	writer   bool // subtask 0: writes the state into checkpoints
	writable bool // inside ProcessBroadcastElement
	maps     map[string]*bmap
	// version counts changes; committed is the version in the latest
	// completed checkpoint; snaps are the versions of the snapshots whose
	// outcome is not known yet.
	version, committed uint64
	snaps              []snapVersion
}

type snapVersion struct{ id, version uint64 }

// bmap is one named broadcast map: encoded key -> encoded value.
type bmap struct {
	prefix []byte // uvarint(len(name)) | name
	m      map[string][]byte
}

// extraState is implemented by keyed functions that checkpoint state of
// their own beside the keyed backend (broadcast state): keyedTask adds
// their Part to its snapshot and tells them the outcomes.
type extraState interface {
	snapshotExtra(id uint64, keyed checkpoint.Part) checkpoint.Part
	noteExtra(n runtime.Note)
}

func (s *broadcastState) open(oc *OpenContext) {
	s.writer = oc.subtask == 0
	oc.bstate = s
}

// register adds (and loads from the store) the broadcast map name.
func (s *broadcastState) register(name string) (*bmap, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("pipeline: broadcast state name length %d (1..255)", len(name))
	}
	if _, dup := s.maps[name]; dup {
		return nil, fmt.Errorf("pipeline: broadcast state %q registered twice", name)
	}
	m := &bmap{prefix: append(binary.AppendUvarint(nil, uint64(len(name))), name...), m: map[string][]byte{}}
	if s.sh.store == nil {
		return nil, errors.New("pipeline: internal: broadcast state without a store")
	}
	err := s.sh.store.NewStateReader(s.uid).Scan(broadcastKeyGroup, m.prefix, func(k, v []byte) bool {
		m.m[string(k[len(m.prefix):])] = append([]byte(nil), v...)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("pipeline: restore broadcast state %q: %w", name, err)
	}
	s.maps[name] = m
	return m, nil
}

func (s *broadcastState) snapshotExtra(id uint64, keyed checkpoint.Part) checkpoint.Part {
	if !s.writer || s.version == s.committed {
		return keyed
	}
	s.snaps = append(s.snaps, snapVersion{id: id, version: s.version})
	bp := &broadcastPart{uid: s.uid}
	for _, m := range s.maps {
		for k, v := range m.m { // values are never modified in place: sharing them is safe
			bp.entries = append(bp.entries, bentry{key: string(m.prefix) + k, val: v})
		}
	}
	slices.SortFunc(bp.entries, func(a, b bentry) int {
		switch {
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		return 0
	})
	return multiPart{keyed, bp}
}

func (s *broadcastState) noteExtra(n runtime.Note) {
	i := 0
	for _, sv := range s.snaps {
		if sv.id > n.ID {
			s.snaps[i] = sv
			i++
			continue
		}
		if n.Completed && sv.id == n.ID {
			s.committed = sv.version
		}
	}
	s.snaps = s.snaps[:i]
}

type bentry struct {
	key string
	val []byte
}

// broadcastPart is subtask 0's broadcast state in a checkpoint: all of it,
// replacing what the store had.
type broadcastPart struct {
	uid     string
	entries []bentry
}

func (p *broadcastPart) SizeHint() int {
	n := 0
	for _, e := range p.entries {
		n += len(e.key) + len(e.val) + len(p.uid) + 8
	}
	return n
}

func (p *broadcastPart) WriteTo(w *checkpoint.Writer) error {
	if err := w.DeleteStateRange(p.uid, broadcastKeyGroup, []byte{}, nil); err != nil {
		return err
	}
	for _, e := range p.entries {
		if err := w.PutState(p.uid, broadcastKeyGroup, []byte(e.key), e.val); err != nil {
			return err
		}
	}
	return nil
}

// multiPart writes several Parts in order.
type multiPart []checkpoint.Part

func (m multiPart) SizeHint() int {
	n := 0
	for _, p := range m {
		if s, ok := p.(checkpoint.PartSizer); ok {
			n += s.SizeHint()
		}
	}
	return n
}

func (m multiPart) WriteTo(w *checkpoint.Writer) error {
	for _, p := range m {
		if err := p.WriteTo(w); err != nil {
			return err
		}
	}
	return nil
}

// BroadcastMap is a named map of broadcast state: every subtask of the
// operator holds the same entries (see ProcessBroadcast). Its methods are
// called from the operator's functions only. Values returned by Get and
// Range are shared with the map: do not modify them.
type BroadcastMap[K, V any] struct {
	st   *broadcastState
	m    *bmap
	kc   Codec[K]
	vc   Codec[V]
	vals map[string]V
	kbuf []byte
}

// NewBroadcastMap registers the broadcast map name of the operator whose
// function is being opened (call it from the Open of a
// BroadcastProcessFunc or KeyedBroadcastProcessFunc), restored from the
// latest checkpoint.
func NewBroadcastMap[K, V any](ctx *OpenContext, name string, kc Codec[K], vc Codec[V]) (*BroadcastMap[K, V], error) {
	if ctx.bstate == nil {
		return nil, errors.New("pipeline: NewBroadcastMap outside the Open of a broadcast function")
	}
	if kc == nil || vc == nil {
		return nil, fmt.Errorf("pipeline: broadcast state %q: nil codec", name)
	}
	m, err := ctx.bstate.register(name)
	if err != nil {
		return nil, err
	}
	bm := &BroadcastMap[K, V]{st: ctx.bstate, m: m, kc: kc, vc: vc, vals: make(map[string]V, len(m.m))}
	for k, b := range m.m {
		v, err := vc.Decode(b)
		if err != nil {
			return nil, fmt.Errorf("pipeline: restore broadcast state %q: %w", name, err)
		}
		bm.vals[k] = v
	}
	return bm, nil
}

func (m *BroadcastMap[K, V]) key(k K) (string, error) {
	b, err := m.kc.Append(m.kbuf[:0], k)
	if err != nil {
		return "", fmt.Errorf("pipeline: encode broadcast key: %w", err)
	}
	m.kbuf = b
	return string(b), nil
}

// Get returns k's value.
func (m *BroadcastMap[K, V]) Get(k K) (V, bool, error) {
	b, err := m.kc.Append(m.kbuf[:0], k)
	if err != nil {
		var z V
		return z, false, fmt.Errorf("pipeline: encode broadcast key: %w", err)
	}
	m.kbuf = b
	v, ok := m.vals[string(b)] // no allocation for the lookup
	return v, ok, nil
}

// Contains reports whether k has a value.
func (m *BroadcastMap[K, V]) Contains(k K) (bool, error) {
	_, ok, err := m.Get(k)
	return ok, err
}

// Len returns the number of entries.
func (m *BroadcastMap[K, V]) Len() int { return len(m.vals) }

// Put sets k's value (ProcessBroadcastElement only: ErrBroadcastReadOnly
// elsewhere).
func (m *BroadcastMap[K, V]) Put(k K, v V) error {
	if !m.st.writable {
		return ErrBroadcastReadOnly
	}
	ks, err := m.key(k)
	if err != nil {
		return err
	}
	b, err := m.vc.Append(nil, v)
	if err != nil {
		return fmt.Errorf("pipeline: encode broadcast value: %w", err)
	}
	m.m.m[ks], m.vals[ks] = b, v
	m.st.version++
	return nil
}

// Delete removes k (ProcessBroadcastElement only: ErrBroadcastReadOnly
// elsewhere).
func (m *BroadcastMap[K, V]) Delete(k K) error {
	if !m.st.writable {
		return ErrBroadcastReadOnly
	}
	ks, err := m.key(k)
	if err != nil {
		return err
	}
	if _, ok := m.vals[ks]; ok {
		delete(m.m.m, ks)
		delete(m.vals, ks)
		m.st.version++
	}
	return nil
}

// Range calls fn for every entry in the order of the keys' encodings until
// fn returns false.
func (m *BroadcastMap[K, V]) Range(fn func(k K, v V) bool) error {
	for _, ks := range slices.Sorted(maps.Keys(m.vals)) {
		k, err := m.kc.Decode([]byte(ks))
		if err != nil {
			return fmt.Errorf("pipeline: decode broadcast key: %w", err)
		}
		if !fn(k, m.vals[ks]) {
			return nil
		}
	}
	return nil
}

type broadcastAdapter[A, B, U any] struct {
	fn  BroadcastProcessFunc[A, B, U]
	st  *broadcastState
	ctx Context[U]
}

func (f *broadcastAdapter[A, B, U]) Open(oc *OpenContext) error {
	f.st.open(oc)
	return f.fn.Open(oc)
}

func (f *broadcastAdapter[A, B, U]) ProcessElement(ctx *KeyedContext[uint32, U], e Either[A, B]) error {
	f.ctx.c = ctx
	if !e.Second {
		return f.fn.ProcessElement(&f.ctx, e.A)
	}
	f.st.writable = true
	defer func() { f.st.writable = false }()
	return f.fn.ProcessBroadcastElement(&f.ctx, e.B)
}

func (f *broadcastAdapter[A, B, U]) OnTimer(*KeyedContext[uint32, U], Timer) error { return nil }

func (f *broadcastAdapter[A, B, U]) Close() error { return closeFn(f.fn) }

func (f *broadcastAdapter[A, B, U]) snapshotExtra(id uint64, p checkpoint.Part) checkpoint.Part {
	return f.st.snapshotExtra(id, p)
}

func (f *broadcastAdapter[A, B, U]) noteExtra(n runtime.Note) { f.st.noteExtra(n) }

type keyedBroadcastAdapter[K comparable, A, B, U any] struct {
	fn  KeyedBroadcastProcessFunc[K, A, B, U]
	st  *broadcastState
	ctx Context[U]
}

func (f *keyedBroadcastAdapter[K, A, B, U]) Open(oc *OpenContext) error {
	f.st.open(oc)
	return f.fn.Open(oc)
}

func (f *keyedBroadcastAdapter[K, A, B, U]) ProcessElement(ctx *KeyedContext[K, U], e Either[A, B]) error {
	if !e.Second {
		return f.fn.ProcessElement(ctx, e.A)
	}
	ctx.backend.ClearCurrentKey()
	f.ctx.c = ctx
	f.st.writable = true
	defer func() { f.st.writable = false }()
	return f.fn.ProcessBroadcastElement(&f.ctx, e.B)
}

func (f *keyedBroadcastAdapter[K, A, B, U]) OnTimer(ctx *KeyedContext[K, U], t Timer) error {
	return f.fn.OnTimer(ctx, t)
}

func (f *keyedBroadcastAdapter[K, A, B, U]) Close() error { return closeFn(f.fn) }

func (f *keyedBroadcastAdapter[K, A, B, U]) snapshotExtra(id uint64, p checkpoint.Part) checkpoint.Part {
	return f.st.snapshotExtra(id, p)
}

func (f *keyedBroadcastAdapter[K, A, B, U]) noteExtra(n runtime.Note) { f.st.noteExtra(n) }

// closeFn closes a user function that has a Close method.
func closeFn(fn any) error {
	if c, ok := fn.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}
