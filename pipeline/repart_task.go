package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/runnel-dev/runnel/checkpoint"

	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/state"
)

// repartSplit is the split key under which a keyed stage's task keeps its
// repartition position in its checkpoints.
const repartSplit = "repartition"

// remotePort is a scale-out task's output to a keyed operator that heads
// another stage: records go to the stage's repartition topic, to the range
// that owns their key group.
type remotePort[K comparable, T any] struct {
	w      *repartWriter
	key    func(T) K
	codec  Codec[K]
	vcodec Codec[T]
	maxP   int
	ranges int
	kbuf   []byte
	vbuf   []byte
}

func newRemotePort[K comparable, T any](b *chainBuilder, n *node, key func(T) K, codec Codec[K], vcodec Codec[T]) (any, error) {
	sc := b.r.scope
	topic, queues := sc.io.repart(n)
	if len(queues) == 0 {
		return nil, fmt.Errorf("pipeline: operator %q: no repartition queues", n.uid)
	}
	var epoch uint64 = 1
	if m, ok := b.r.engine.Store().Latest(); ok {
		epoch = m.ID + 1
	}
	task, owner := b.r.originTag()
	p := &remotePort[K, T]{w: newRepartWriter(sc.io.producer, topic, queues, task, owner, epoch),
		key: key, codec: codec, vcodec: vcodec, maxP: b.r.job.cfg.maxParallelism, ranges: len(queues)}
	b.addPort(p)
	return emitFn[T](p.emit), nil
}

func (p *remotePort[K, T]) emit(ctx context.Context, v T, ts int64) error {
	kb, err := p.codec.Append(p.kbuf[:0], p.key(v))
	if err != nil {
		return fmt.Errorf("pipeline: encode key: %w", err)
	}
	p.kbuf = kb
	vb, err := p.vcodec.Append(p.vbuf[:0], v)
	if err != nil {
		return fmt.Errorf("pipeline: encode record for repartition: %w", err)
	}
	p.vbuf = vb
	r := state.SubtaskOf(state.KeyGroup(kb, p.maxP), p.maxP, p.ranges)
	p.w.add(r, kb, ts, vb)
	if p.w.full(r) {
		return p.w.flush(ctx)
	}
	return nil
}

func (p *remotePort[K, T]) flush(ctx context.Context) error { return p.w.flush(ctx) }
func (p *remotePort[K, T]) sync(ctx context.Context) error  { return p.w.sync(ctx) }

// barrier starts the next epoch: records after barrier id are completed by
// checkpoint id+1 (or, if that one fails, by the next that completes).
func (p *remotePort[K, T]) barrier(_ context.Context, id uint64, _ bool) error {
	p.w.epoch = id + 1
	return nil
}

func (p *remotePort[K, T]) watermark(_ context.Context, wm int64) error {
	p.w.wm = wm
	return nil
}

func (p *remotePort[K, T]) end(ctx context.Context) error { return p.w.end(ctx) }

// repartTask feeds a keyed stage's head from its repartition queue: it is
// the head's only sender, injecting barriers like a source task and
// forwarding the minimum watermark of the stage's upstream tasks.
type repartTask[K comparable, T any] struct {
	r      *jobRun
	n      *node
	in     *inbox[krec[K, T]]
	pool   *sync.Pool
	sender int
	codec  Codec[K]
	vcodec Codec[T]
	src    *repartSource
	key    string // the position's split key

	origins map[string]int
	wms     *inputWatermarks
	ended   []bool
	wm      int64 // last watermark forwarded
	outIdle bool
	batch   *[]krec[K, T]
	keys    *[]byte // batch's encoded keys (message.keys)
	cnt     *counter
}

func startRepartTask[K comparable, T any](r *jobRun, t *taskInfo, n *node, in *inbox[krec[K, T]], pool *sync.Pool, codec Codec[K], vcodec Codec[T]) error {
	sc := r.scope
	pos, err := decodeRepartPosition(r.engine.RestoredOffset(n.uid, repartSplit))
	if err != nil {
		return err
	}
	sender, ok := r.senderIdx[[2]int{t.idx, n.id}]
	if !ok {
		return fmt.Errorf("pipeline: internal: repartition task is not a sender of %q", n.uid)
	}
	rt := &repartTask[K, T]{r: r, n: n, in: in, pool: pool, sender: sender, codec: codec, vcodec: vcodec,
		src: &repartSource{c: sc.io.client, group: sc.io.group, q: sc.io.input, dec: sc.io.dec, pos: pos, readUncommitted: sc.io.readUncommitted},
		key: repartSplit, origins: map[string]int{}, wm: math.MinInt64}
	for _, o := range sc.origins {
		rt.origin(o)
	}
	for o, st := range pos.origins {
		i := rt.origin(o)
		rt.ended[i] = st.eos
		rt.wms.update(i, st.wm)
	}
	rt.cnt = &counter{stats: n.stats}
	_, err = r.engine.AddTask(n.uid+"/"+repartSplit, runtime.SourceTask, rt.run)
	return err
}

// origin returns the index of an upstream task, adding it when new.
func (rt *repartTask[K, T]) origin(o string) int {
	if i, ok := rt.origins[o]; ok {
		return i
	}
	i := len(rt.origins)
	rt.origins[o] = i
	if rt.wms == nil {
		rt.wms = newInputWatermarks(0, math.MinInt64)
	}
	rt.wms.grow(i + 1)
	rt.ended = append(rt.ended, false)
	return i
}

func (rt *repartTask[K, T]) push(ctx context.Context, m message[krec[K, T]]) error {
	return rt.in.push(ctx, rt.sender, m)
}

// flush implements port: the head's partial batch goes to its inbox.
func (rt *repartTask[K, T]) flush(ctx context.Context) error {
	if rt.batch == nil || len(*rt.batch) == 0 {
		return nil
	}
	b, ks := rt.batch, rt.keys
	rt.batch, rt.keys = nil, nil
	rt.cnt.flush()
	return rt.push(ctx, message[krec[K, T]]{kind: msgData, batch: b, keys: ks})
}

// barrier implements port.
func (rt *repartTask[K, T]) barrier(ctx context.Context, id uint64, stop bool) error {
	if err := rt.flush(ctx); err != nil {
		return err
	}
	return rt.push(ctx, message[krec[K, T]]{kind: msgBarrier, id: id, stop: stop})
}

// watermark implements port.
func (rt *repartTask[K, T]) watermark(ctx context.Context, wm int64) error {
	if err := rt.flush(ctx); err != nil {
		return err
	}
	return rt.push(ctx, message[krec[K, T]]{kind: msgWatermark, wm: wm})
}

// end implements port.
func (rt *repartTask[K, T]) end(ctx context.Context) error {
	if err := rt.flush(ctx); err != nil {
		return err
	}
	return rt.push(ctx, message[krec[K, T]]{kind: msgEOS})
}

// snapshot implements checkpointed: the task's position in the
// repartition queue.
func (rt *repartTask[K, T]) snapshot(context.Context, uint64) (runtime.Ack, error) {
	return runtime.Ack{Offsets: map[string][]byte{checkpoint.SplitKey(rt.n.uid, rt.key): rt.src.pos.encode()}}, nil
}

// note implements checkpointed: nothing to do.
func (rt *repartTask[K, T]) note(context.Context, runtime.Note) error { return nil }

func (rt *repartTask[K, T]) run(ctx context.Context, h *runtime.Handle) (err error) {
	defer recoverTask(&err)
	defer h.ReleasePollContext()
	maxP := rt.r.job.cfg.maxParallelism
	kgStart, kgEnd := rt.r.keyGroupsOf(rt.n, 0)
	// The task is its head's only sender: it is its own output port.
	core := &taskCore{h: h, ports: []port{rt}, counters: rt.cnt.flush, cp: rt}
	for {
		if done, err := core.beforePoll(ctx); done {
			return err
		}
		pctx := h.PollContext(ctx)
		hdr, body, ok, err := rt.src.poll(pctx)
		if err != nil {
			return err
		}
		if !ok {
			if err := rt.flush(ctx); err != nil {
				return err
			}
			continue
		}
		for range hdr.count {
			kb, ts, vb, err := body.next()
			if err != nil {
				return fmt.Errorf("repartition batch of %s: %w", hdr.origin, err)
			}
			kg := state.KeyGroup(kb, maxP)
			if kg < kgStart || kg >= kgEnd {
				return fmt.Errorf("repartition batch of %s holds key group %d, outside this task's [%d, %d): the writer uses another number of ranges or key groups", hdr.origin, kg, kgStart, kgEnd)
			}
			k, err := rt.codec.Decode(kb)
			if err != nil {
				return fmt.Errorf("decode key from repartition: %w", err)
			}
			v, err := rt.vcodec.Decode(vb)
			if err != nil {
				return fmt.Errorf("decode record from repartition: %w", err)
			}
			if rt.batch == nil {
				rt.batch, rt.keys = getBatch[krec[K, T]](rt.pool), getKeys(rt.in.keys)
			}
			*rt.keys = append(*rt.keys, kb...) // bounded: kb is part of one broker message
			*rt.batch = append(*rt.batch, krec[K, T]{k: k, v: v, ts: ts, kg: kg, kend: uint32(len(*rt.keys))})
			rt.cnt.in++
			rt.cnt.out++
			if len(*rt.batch) >= batchSize {
				if err := rt.flush(ctx); err != nil {
					return err
				}
			}
		}
		rt.src.take(hdr)
		i := rt.origin(hdr.origin)
		if hdr.eos {
			rt.ended[i] = true
		}
		rt.wms.update(i, hdr.wm)
		if err := rt.advance(ctx); err != nil {
			return err
		}
		if !slices.Contains(rt.ended, false) {
			return core.end(ctx)
		}
	}
}

// advance forwards the upstream tasks' combined watermark when it moved,
// and idleness when every live upstream task is idle.
func (rt *repartTask[K, T]) advance(ctx context.Context) error {
	wm, idle := rt.wms.combined(rt.ended)
	if idle {
		if rt.outIdle {
			return nil
		}
		rt.outIdle = true
		return rt.watermark(ctx, idleWatermark)
	}
	if wm == math.MaxInt64 || (wm <= rt.wm && !rt.outIdle) || wm <= activeNoWatermark {
		return nil
	}
	rt.outIdle = false
	rt.wm = max(rt.wm, wm)
	return rt.watermark(ctx, rt.wm)
}
