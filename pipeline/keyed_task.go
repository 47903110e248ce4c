package pipeline

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/state"
)

// krec is a record on a channel to a keyed subtask. Its key travels both
// as K (KeyedContext.Key) and encoded, in its message's keys: the sender
// encodes it once (it needs the bytes for the key group), and the subtask
// sets the state backend's current key from those bytes.
type krec[K comparable, T any] struct {
	k  K
	v  T
	ts int64
	kg uint16 // k's key group, computed once by the sender
	// kend is where the record's encoded key ends in its message's keys;
	// it starts where the previous record's ends (at 0 for the first).
	kend uint32
}

// newKeyPool returns a pool of key arenas (message.keys) for batches of
// krec.
func newKeyPool() *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]byte, 0, batchSize*16)
		return &b
	}}
}

// getKeys takes an empty key arena from the pool.
func getKeys(pool *sync.Pool) *[]byte {
	b := pool.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

// keyedPort is one task's output to the subtasks of a keyed operator.
type keyedPort[K comparable, T any] struct {
	ins     []*inbox[krec[K, T]]
	sender  int
	pool    *sync.Pool
	kpool   *sync.Pool // of the batches' key arenas
	bufs    []*[]krec[K, T]
	keys    []*[]byte // per subtask, the open batch's encoded keys
	key     func(T) K
	codec   Codec[K]
	maxP    int
	scratch []byte
	meta    *recMeta     // the sending task's current record (its trace)
	trs     [][]tracedAt // per subtask, the open batch's traced records (hooks.go); nil until one is
	all     func(T) bool // see KeyedStream.all; nil for most streams
}

func (p *keyedPort[K, T]) emit(ctx context.Context, v T, ts int64) error {
	k := p.key(v)
	kb, err := p.codec.Append(p.scratch[:0], k)
	if err != nil {
		return fmt.Errorf("pipeline: encode key: %w", err)
	}
	p.scratch = kb
	kg := state.KeyGroup(kb, p.maxP)
	if p.all != nil && p.all(v) {
		return p.emitAll(ctx, krec[K, T]{k: k, v: v, ts: ts, kg: kg}, kb) // broadcast.go
	}
	sub := 0
	if len(p.ins) > 1 {
		sub = state.SubtaskOf(kg, p.maxP, len(p.ins))
	}
	n, err := p.add(sub, krec[K, T]{k: k, v: v, ts: ts, kg: kg}, kb)
	if err != nil {
		return err
	}
	if p.meta.trace != nil {
		p.noteTrace(sub, n-1) // hooks.go
	}
	if n >= batchSize {
		return p.send(ctx, sub)
	}
	return nil
}

// add appends r, with its encoded key kb, to subtask sub's open batch and
// returns the batch's length.
func (p *keyedPort[K, T]) add(sub int, r krec[K, T], kb []byte) (int, error) {
	b := p.bufs[sub]
	if b == nil {
		b = getBatch[krec[K, T]](p.pool)
		p.bufs[sub], p.keys[sub] = b, getKeys(p.kpool)
	}
	ks := p.keys[sub]
	if uint64(len(*ks))+uint64(len(kb)) > math.MaxUint32 {
		return 0, fmt.Errorf("pipeline: encoded keys of one batch exceed 4 GiB")
	}
	*ks = append(*ks, kb...)
	r.kend = uint32(len(*ks))
	*b = append(*b, r)
	return len(*b), nil
}

// send sends subtask sub's open batch.
func (p *keyedPort[K, T]) send(ctx context.Context, sub int) error {
	b, ks := p.bufs[sub], p.keys[sub]
	p.bufs[sub], p.keys[sub] = nil, nil
	return p.ins[sub].push(ctx, p.sender, message[krec[K, T]]{kind: msgData, batch: b, keys: ks, traces: p.takeTraces(sub)})
}

func (p *keyedPort[K, T]) flush(ctx context.Context) error {
	for i, b := range p.bufs {
		if b == nil || len(*b) == 0 {
			continue
		}
		if err := p.send(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

func (p *keyedPort[K, T]) broadcast(ctx context.Context, m message[krec[K, T]]) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	return pushAll(ctx, p.ins, p.sender, m)
}

func (p *keyedPort[K, T]) barrier(ctx context.Context, id uint64, stop bool) error {
	return p.broadcast(ctx, message[krec[K, T]]{kind: msgBarrier, id: id, stop: stop})
}

func (p *keyedPort[K, T]) watermark(ctx context.Context, wm int64) error {
	return p.broadcast(ctx, message[krec[K, T]]{kind: msgWatermark, wm: wm})
}

func (p *keyedPort[K, T]) end(ctx context.Context) error {
	return p.broadcast(ctx, message[krec[K, T]]{kind: msgEOS})
}

// keyedOp adds a keyed operator node.
func keyedOp[K comparable, T, U any](k *KeyedStream[K, T], uid, kind, stateCodecs string, newFn func() KeyedProcessFunc[K, T, U], opts []OperatorOption) *Stream[U] {
	j := k.s.n.job
	n := j.addNode(uid, kind, k.s.n)
	cfg := applyOps(n, opts)
	n.exchange = true
	n.parallelism = j.cfg.parallelism
	if cfg.parallelism != 0 {
		n.parallelism = cfg.parallelism
	}
	if newFn == nil {
		j.errorf("keyed operator %q: nil function constructor", uid)
	}
	if k.codec != nil {
		n.codecs = "key=" + k.codec.ID()
	}
	if stateCodecs != "" {
		n.codecs += ";" + stateCodecs
	}
	n.prePartitioned = k.prePartitioned
	vcodec := k.vcodec
	if vcodec == nil {
		vcodec = JSON[T]()
	}
	pool, kpool := newBatchPool[krec[K, T]](), newKeyPool()
	var ins []*inbox[krec[K, T]]
	n.setup = func(r *jobRun) error {
		p := n.parallelism
		if r.scope != nil {
			p = 1 // a scale-out task runs one subtask over its key groups
		}
		ins = make([]*inbox[krec[K, T]], p)
		for i := range ins {
			ins[i] = newInbox[krec[K, T]](n.senders, pool)
			ins[i].keys = kpool
		}
		return nil
	}
	n.addSender = func() {
		for _, in := range ins {
			in.addSender()
		}
	}
	n.buildInput = func(b *chainBuilder) (any, error) {
		if b.r.remote(n) {
			return n.buildRemote(b)
		}
		s, err := b.sender(n)
		if err != nil {
			return nil, err
		}
		p := &keyedPort[K, T]{ins: ins, sender: s, pool: pool, kpool: kpool, bufs: make([]*[]krec[K, T], len(ins)), keys: make([]*[]byte, len(ins)),
			key: k.key, codec: k.codec, maxP: j.cfg.maxParallelism, meta: &b.meta, all: k.all}
		b.addPort(p)
		return emitFn[T](p.emit), nil
	}
	n.buildRemote = func(b *chainBuilder) (any, error) {
		if k.all != nil {
			return nil, fmt.Errorf("%w: operator %q: %w", ErrInvalidGraph, uid, ErrBroadcastScaleout) // broadcast.go
		}
		return newRemotePort(b, n, k.key, k.codec, vcodec)
	}
	n.startRepart = func(r *jobRun, t *taskInfo) error {
		return startRepartTask(r, t, n, ins[0], pool, k.codec, vcodec)
	}
	n.taskCount = func(_ context.Context, r *jobRun) (int, error) {
		if r.scope == nil {
			return n.parallelism, nil
		}
		if r.scope.local[n] {
			return 1, nil
		}
		return 0, nil // another stage's head: its tasks run elsewhere
	}
	n.startTask = func(r *jobRun, t *taskInfo) error {
		b := newChainBuilder(r, t)
		emit, err := outputs[U](b, n.outs)
		if err != nil {
			return err
		}
		sides := make(map[string][]any)
		for _, sn := range n.sides {
			in, err := b.input(sn)
			if err != nil {
				return err
			}
			sides[sn.codecs] = append(sides[sn.codecs], in)
		}
		kt := &keyedTask[K, T, U]{
			n: n, j: j, sub: t.subtask, in: ins[t.subtask], codec: k.codec, newFn: newFn,
			b: b, emit: emit, sides: sides, reject: b.rejecter(n), store: r, lateH: b.newLateHandler(n, t.subtask),
		}
		_, err = r.engine.AddTask(fmt.Sprintf("%s/%d", uid, t.subtask), runtime.OperatorTask, kt.run)
		return err
	}
	return &Stream[U]{n: n}
}

// keyedTask is one subtask of a keyed operator: the inputTask of its
// inputLoop (taskloop.go).
type keyedTask[K comparable, T, U any] struct {
	inputDefaults
	n      *node
	j      *Job
	sub    int
	in     *inbox[krec[K, T]]
	codec  Codec[K]
	newFn  func() KeyedProcessFunc[K, T, U]
	b      *chainBuilder
	emit   emitFn[U]
	sides  map[string][]any
	reject func(ctx context.Context, err error, v any, ts int64) error
	store  *jobRun
	lateH  *lateHandler // late.go

	h         *runtime.Handle
	backend   *state.Backend
	timers    *state.Timers
	wmStore   *keyedWatermarkStore
	kctx      *KeyedContext[K, U]
	fn        KeyedProcessFunc[K, T, U]
	processFn func(*KeyedContext[K, U], T) error
	onTimer   func(*KeyedContext[K, U], Timer) error
	onGroup   func(*KeyedContext[K, U], uint16, Timer) error // nil: not a GroupTimerFunc
	cnt       *counter
	procTimer *time.Timer // armed for the next processing timer
	scratch   []byte
	groupTS   int64 // the firing group timer's time (for ForKey's dead letters)
}

const timerStateName = "runnel.timers"

func (kt *keyedTask[K, T, U]) run(ctx context.Context, h *runtime.Handle) (err error) {
	defer recoverTask(&err)
	eng := kt.store.engine
	maxP := kt.j.cfg.maxParallelism
	start, end := kt.store.keyGroupsOf(kt.n, kt.sub)
	bopts := []state.BackendOption{state.WithKeyGroupRange(start, end)}
	if kt.j.cfg.stateBuffer > 0 {
		bopts = append(bopts, state.WithWriteBufferLimit(kt.j.cfg.stateBuffer))
	}
	if c := kt.j.cfg.stateCache; c != 0 {
		bopts = append(bopts, state.WithReadCacheSize(max(c, 0)))
	}
	kt.backend, err = state.NewBackend(eng.Store(), kt.n.uid, maxP, bopts...)
	if err != nil {
		return err
	}
	if kt.timers, err = state.NewTimers(kt.backend, timerStateName); err != nil {
		return err
	}
	if kt.wmStore, err = newKeyedWatermarkStore(kt.backend); err != nil {
		return err
	}
	restoredWM, err := kt.wmStore.restore(kt.backend)
	if err != nil {
		return fmt.Errorf("restore watermark: %w", err)
	}
	wmGauge := kt.n.stats.Watermark(kt.sub) // the status endpoint's
	wmGauge.Store(restoredWM)
	kt.fn = kt.newFn()
	oc := &OpenContext{backend: kt.backend, subtask: kt.sub, parallelism: kt.n.parallelism, log: kt.j.cfg.logger}
	if err := protectErr(func(f KeyedProcessFunc[K, T, U], oc *OpenContext) error { return f.Open(oc) }, kt.fn, oc); err != nil {
		return fmt.Errorf("open: %w", err)
	}
	if c, ok := kt.fn.(interface{ Close() error }); ok {
		defer func() {
			if cerr := c.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("close: %w", cerr)
			}
		}()
	}
	kt.h = h
	kt.cnt = kt.b.counter(kt.n)
	kt.kctx = &KeyedContext[K, U]{ctx: ctx, uctx: ctx, wm: restoredWM, emit: kt.emit, timers: kt.timers, backend: kt.backend,
		sides: kt.sides, clock: kt.j.cfg.clock, out: kt.cnt, task: kt}
	kt.processFn = kt.fn.ProcessElement
	kt.onTimer = kt.fn.OnTimer
	if g, ok := kt.fn.(GroupTimerFunc[K, U]); ok {
		kt.onGroup = g.OnGroupTimer
	}
	kt.procTimer = time.NewTimer(time.Hour)
	kt.procTimer.Stop()
	defer kt.procTimer.Stop()
	return newInputLoop(h, kt.in, inputTask[krec[K, T]](kt), kt.b.ports, kt.b.flushCounters, true, restoredWM, wmGauge).run(ctx)
}

// process implements inputTask: it runs the function on every record of
// the batch, under the record's key.
func (kt *keyedTask[K, T, U]) process(ctx context.Context, m message[krec[K, T]]) error {
	batch, keys, traces := *m.batch, *m.keys, m.traces
	kstart := uint32(0)
	for i := range batch {
		r := &batch[i]
		kt.backend.SetCurrentKeyGroup(keys[kstart:r.kend], r.kg) // the sender's encoding of r.k
		kstart = r.kend
		var err error
		kt.kctx.key, kt.kctx.ts = r.k, r.ts
		kt.cnt.in++
		if len(traces) > 0 && traces[0].i == i {
			err = kt.processTraced(ctx, traces[0].tr, kt.processFn, r.v) // hooks.go
			traces = traces[1:]
		} else {
			err = callErr(ctx, kt.n.retry, kt.processFn, kt.kctx, r.v)
		}
		if err != nil {
			if err := kt.reject(ctx, err, r.v, r.ts); err != nil {
				return err
			}
		}
	}
	if kt.backend.WantsCheckpoint() {
		kt.h.RequestCheckpoint() // spill the changes through a checkpoint
	}
	return nil
}

// snapshot implements checkpointed: the watermark and the keyed state.
func (kt *keyedTask[K, T, U]) snapshot(_ context.Context, id uint64) (runtime.Ack, error) {
	if err := kt.wmStore.save(kt.backend, kt.kctx.wm); err != nil {
		return runtime.Ack{}, fmt.Errorf("save watermark: %w", err)
	}
	part := kt.backend.Snapshot(id)
	if x, ok := kt.fn.(extraState); ok {
		part = x.snapshotExtra(id, part) // broadcast.go
	}
	return runtime.Ack{Part: part}, nil
}

// note implements checkpointed. It never fails.
func (kt *keyedTask[K, T, U]) note(_ context.Context, n runtime.Note) error {
	if n.Completed {
		kt.backend.Committed(n.ID)
	} else {
		kt.backend.Aborted(n.ID)
	}
	if x, ok := kt.fn.(extraState); ok {
		x.noteExtra(n) // broadcast.go
	}
	return nil
}

// advanced implements inputTask: it fires the event timers up to wm.
func (kt *keyedTask[K, T, U]) advanced(ctx context.Context, wm int64) error {
	kt.kctx.wm = wm
	return kt.fire(ctx, state.EventTime, wm)
}

// watermark implements inputTask.
func (kt *keyedTask[K, T, U]) watermark(ctx context.Context, wm int64) error {
	return watermarkPorts(ctx, kt.b.ports, wm)
}

// wakeups implements inputTask: it fires the due processing timers and
// arms procTimer for the next one (at most 50 ms ahead: the job's clock
// may be a test's).
func (kt *keyedTask[K, T, U]) wakeups(ctx context.Context) (<-chan struct{}, <-chan time.Time, error) {
	for kt.timers.Len(state.ProcessingTime) > 0 {
		next, _ := kt.timers.NextTimestamp(state.ProcessingTime)
		d := min(time.Duration(next-kt.j.cfg.clock().UnixNano()), 50*time.Millisecond)
		if d <= 0 {
			if err := kt.fire(ctx, state.ProcessingTime, kt.j.cfg.clock().UnixNano()); err != nil {
				return nil, nil, err
			}
			continue
		}
		kt.procTimer.Reset(d)
		return nil, kt.procTimer.C, nil
	}
	return nil, nil, nil
}

// fire runs the due timers of domain d up to upTo: for event time, key
// group timers too, in timestamp order (a group timer before the key
// timers of its time).
func (kt *keyedTask[K, T, U]) fire(ctx context.Context, d state.TimeDomain, upTo int64) error {
	if d == state.EventTime && kt.timers.Len(state.GroupEventTime) > 0 {
		return kt.fireGroups(ctx, upTo)
	}
	for t, err := range kt.timers.Due(d, upTo) {
		if err != nil {
			return err
		}
		if err := kt.fireOne(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// fireGroups is fire for event time with group timers registered.
func (kt *keyedTask[K, T, U]) fireGroups(ctx context.Context, upTo int64) error {
	for {
		g, gok := kt.timers.NextTimestamp(state.GroupEventTime)
		e, eok := kt.timers.NextTimestamp(state.EventTime)
		gok, eok = gok && g <= upTo, eok && e <= upTo
		d := state.EventTime
		switch {
		case gok && (!eok || g <= e):
			d = state.GroupEventTime
		case !eok:
			return nil
		}
		t, _, err := kt.timers.PopDue(d, upTo)
		if err != nil {
			return err
		}
		if d == state.EventTime {
			if err := kt.fireOne(ctx, t); err != nil {
				return err
			}
			continue
		}
		if kt.onGroup == nil {
			return fmt.Errorf("pipeline: %s: a key group timer fired, but the function has no OnGroupTimer", kt.n.uid)
		}
		kt.kctx.key, kt.kctx.ts, kt.groupTS = *new(K), t.Timestamp, t.Timestamp
		// Only what fails the job comes back: ForKey applies the error
		// policy per key.
		if err := protectErr(func(c *KeyedContext[K, U], t state.Timer) error {
			return kt.onGroup(c, t.KeyGroup, Timer{Time: time.Unix(0, t.Timestamp), Domain: state.EventTime})
		}, kt.kctx, t); err != nil {
			return err
		}
	}
}

// fireOne runs the key timer t.
func (kt *keyedTask[K, T, U]) fireOne(ctx context.Context, t state.Timer) error {
	k, err := kt.codec.Decode(t.Key)
	if err != nil {
		return fmt.Errorf("decode timer key: %w", err)
	}
	kt.backend.SetCurrentKeyGroup(t.Key, t.KeyGroup)
	kt.kctx.key, kt.kctx.ts = k, t.Timestamp
	if err := callErr(ctx, kt.n.retry, kt.onTimer, kt.kctx, Timer{Time: time.Unix(0, t.Timestamp), Domain: t.Domain}); err != nil {
		if err := kt.reject(ctx, err, t, t.Timestamp); err != nil {
			return err
		}
	}
	return nil
}

// decodeKey implements keyTask.
func (kt *keyedTask[K, T, U]) decodeKey(b []byte) (K, error) {
	k, err := kt.codec.Decode(b)
	if err != nil {
		return k, fmt.Errorf("decode key: %w", err)
	}
	return k, nil
}

// callKeyFn calls fn with c (for callErr).
func callKeyFn[K comparable, U any](c *KeyedContext[K, U], fn func(*KeyedContext[K, U]) error) error {
	return fn(c)
}

// forKey implements keyTask.
func (kt *keyedTask[K, T, U]) forKey(k K, kb []byte, kg uint16, fn func(*KeyedContext[K, U]) error) error {
	if kb == nil {
		var err error
		if kb, err = kt.codec.Append(kt.scratch[:0], k); err != nil {
			return fmt.Errorf("encode key: %w", err)
		}
		kt.scratch = kb
	}
	kt.backend.SetCurrentKeyGroup(kb, kg)
	kt.kctx.key = k
	ctx := kt.kctx.ctx
	if err := callErr(ctx, kt.n.retry, callKeyFn[K, U], kt.kctx, fn); err != nil {
		t := state.Timer{Domain: state.EventTime, Timestamp: kt.groupTS, KeyGroup: kg, Key: append([]byte(nil), kb...)}
		if err := kt.reject(ctx, err, t, kt.groupTS); err != nil {
			return err
		}
	}
	return nil
}
