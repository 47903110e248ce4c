package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Repartition topics (scale-out): a keyed stage's input. Records cross a
// repartition topic in batches: one RocketMQ message carries the records one
// upstream task (the origin) sends to one key-group range in one epoch,
// with the origin's watermark after them (idleWatermark when the origin is
// idle, activeNoWatermark before it has one). The message is tagged with the
// origin task, its owner epoch and the epoch (the id of the origin's
// checkpoint that completes it), so that a reader counts it only once the
// origin's commit chain says so (read committed, as Kafka consumers read
// transactional topics), and with a per-(origin, range) batch sequence
// that tells retried sends apart.
//
// Body: magic "RP" | version | origin (uvarint length, bytes) | owner epoch
// (uvarint) | epoch (uvarint) | batch seq (uvarint) | watermark (varint) |
// flags (1 = end of the origin's stream) | count (uvarint) | count records
// of key (uvarint length, bytes) | event time (varint) | value (uvarint
// length, bytes).

var repartMagic = [2]byte{'R', 'P'}

const (
	repartVersion = 1
	repartEOS     = 1
	// repartBatchBytes: a batch is sent once it holds this much.
	repartBatchBytes = 256 << 10
	// repartWatermarkEvery throttles watermark-only messages per range.
	repartWatermarkEvery = 100 * time.Millisecond
	// repartMaxOrigins bounds the origins a reader tracks.
	repartMaxOrigins = 1 << 16
)

// repartHeader is a batch message's tag.
type repartHeader struct {
	origin     string
	ownerEpoch uint64
	epoch      uint64
	seq        uint64
	wm         int64
	eos        bool
	count      int
}

func appendRepartHeader(dst []byte, h repartHeader) []byte {
	dst = append(dst, repartMagic[0], repartMagic[1], repartVersion)
	dst = binary.AppendUvarint(dst, uint64(len(h.origin)))
	dst = append(dst, h.origin...)
	dst = binary.AppendUvarint(dst, h.ownerEpoch)
	dst = binary.AppendUvarint(dst, h.epoch)
	dst = binary.AppendUvarint(dst, h.seq)
	dst = binary.AppendVarint(dst, h.wm)
	var flags byte
	if h.eos {
		flags |= repartEOS
	}
	dst = append(dst, flags)
	return binary.AppendUvarint(dst, uint64(h.count))
}

// repartReader decodes a batch message's body: header, then records.
type repartBody struct {
	b   []byte
	err error
}

func (d *repartBody) uvarint(limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > limit {
		d.err = errors.New("pipeline: bad repartition batch")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *repartBody) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errors.New("pipeline: bad repartition batch")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *repartBody) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.err = errors.New("pipeline: truncated repartition batch")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func decodeRepartHeader(b []byte) (repartHeader, *repartBody, error) {
	if len(b) < 3 || b[0] != repartMagic[0] || b[1] != repartMagic[1] || b[2] != repartVersion {
		return repartHeader{}, nil, errors.New("pipeline: not a repartition batch")
	}
	d := &repartBody{b: b[3:]}
	h := repartHeader{origin: string(d.bytes(d.uvarint(512)))}
	h.ownerEpoch = d.uvarint(math.MaxInt64)
	h.epoch = d.uvarint(math.MaxInt64)
	h.seq = d.uvarint(math.MaxInt64)
	h.wm = d.varint()
	flags := d.bytes(1)
	h.count = int(d.uvarint(1 << 24))
	if d.err != nil {
		return repartHeader{}, nil, d.err
	}
	h.eos = flags[0]&repartEOS != 0
	return h, d, nil
}

// next returns the next record of the body.
func (d *repartBody) next() (key []byte, ts int64, val []byte, err error) {
	key = d.bytes(d.uvarint(1 << 20))
	ts = d.varint()
	val = d.bytes(d.uvarint(64 << 20))
	return key, ts, val, d.err
}

// repartWriter sends one task's records for one keyed stage to its
// repartition topic: a buffer per range, at most one send in flight per
// range (so an origin's batches reach each range in order), sync waiting
// for all of them (before the task acknowledges a checkpoint).
type repartWriter struct {
	p      *client.Producer
	topic  string
	queues []protocol.MessageQueue // by range
	origin string
	owner  uint64
	epoch  uint64 // the epoch the buffered records belong to

	bufs   [][]byte // encoded records per range
	counts []int
	seqs   []uint64
	wmSent []int64
	wmAt   []time.Time
	wm     int64

	inflight []*repartSend // per range, nil when none
}

type repartSend struct {
	msg  client.Message
	done chan struct{}
	err  error
}

func newRepartWriter(p *client.Producer, topic string, queues []protocol.MessageQueue, origin string, owner, epoch uint64) *repartWriter {
	n := len(queues)
	w := &repartWriter{p: p, topic: topic, queues: queues, origin: origin, owner: owner, epoch: epoch,
		bufs: make([][]byte, n), counts: make([]int, n), seqs: make([]uint64, n), wmSent: make([]int64, n),
		wmAt: make([]time.Time, n), wm: activeNoWatermark, inflight: make([]*repartSend, n)}
	for i := range w.wmSent {
		w.wmSent[i] = activeNoWatermark
	}
	return w
}

// add appends one record for range r.
func (w *repartWriter) add(r int, key []byte, ts int64, val []byte) {
	b := w.bufs[r]
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendVarint(b, ts)
	b = binary.AppendUvarint(b, uint64(len(val)))
	w.bufs[r] = append(b, val...)
	w.counts[r]++
}

// full reports whether range r's buffer should be sent now.
func (w *repartWriter) full(r int) bool { return len(w.bufs[r]) >= repartBatchBytes }

// flush sends, without waiting, the buffers of ranges with no send in
// flight (and watermark-only batches where the watermark moved and the
// throttle allows); a range whose previous send is still in flight keeps
// accumulating.
func (w *repartWriter) flush(ctx context.Context) error {
	now := time.Now()
	for r := range w.queues {
		if s := w.inflight[r]; s != nil {
			select {
			case <-s.done:
				if err := w.settle(ctx, r); err != nil {
					return err
				}
			default:
				continue
			}
		}
		wmDue := w.wm != w.wmSent[r] && (w.wm == idleWatermark || w.wmSent[r] == idleWatermark || now.Sub(w.wmAt[r]) >= repartWatermarkEvery)
		if w.counts[r] > 0 || wmDue {
			w.send(ctx, r, false)
		}
	}
	return nil
}

// send starts sending range r's buffer as one batch.
func (w *repartWriter) send(ctx context.Context, r int, eos bool) {
	h := repartHeader{origin: w.origin, ownerEpoch: w.owner, epoch: w.epoch, seq: w.seqs[r], wm: w.wm, eos: eos, count: w.counts[r]}
	body := appendRepartHeader(make([]byte, 0, len(w.bufs[r])+64), h)
	body = append(body, w.bufs[r]...)
	w.bufs[r], w.counts[r] = w.bufs[r][:0], 0
	w.seqs[r]++
	w.wmSent[r], w.wmAt[r] = w.wm, time.Now()
	q := w.queues[r]
	s := &repartSend{msg: client.Message{Topic: w.topic, Body: body, Queue: &q}, done: make(chan struct{})}
	w.inflight[r] = s
	w.p.SendAsync(ctx, func(_ client.SendResult, err error) {
		s.err = err
		close(s.done)
	}, &s.msg)
}

// settle ends range r's finished send: a failed one is sent again,
// synchronously and with retries (the same batch seq: a reader drops the
// copy if both arrive).
func (w *repartWriter) settle(ctx context.Context, r int) error {
	s := w.inflight[r]
	w.inflight[r] = nil
	if s.err == nil {
		return nil
	}
	if _, err := w.p.Send(ctx, &s.msg); err != nil {
		return fmt.Errorf("pipeline: repartition %s: %w (first attempt: %v)", w.topic, err, s.err)
	}
	return nil
}

// sync sends everything buffered and waits until every batch is stored.
func (w *repartWriter) sync(ctx context.Context) error {
	for r := range w.queues {
		if err := w.wait(ctx, r); err != nil {
			return err
		}
		if w.counts[r] > 0 || w.wm != w.wmSent[r] {
			w.send(ctx, r, false)
		}
	}
	for r := range w.queues {
		if err := w.wait(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

func (w *repartWriter) wait(ctx context.Context, r int) error {
	s := w.inflight[r]
	if s == nil {
		return nil
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return w.settle(ctx, r)
}

// end sends an end-of-stream batch to every range and waits for them.
func (w *repartWriter) end(ctx context.Context) error {
	if err := w.sync(ctx); err != nil {
		return err
	}
	for r := range w.queues {
		w.send(ctx, r, true)
	}
	return w.sync(ctx)
}

// originState is what a reader keeps per origin: the last batch it took
// (to drop a retried copy), the origin's watermark and whether it ended.
type originState struct {
	owner, seq uint64
	seen       bool
	wm         int64
	eos        bool
}

// repartPosition is a reader's checkpointed position: the next queue
// offset and the origins' states.
type repartPosition struct {
	next    int64
	origins map[string]*originState
}

func (p *repartPosition) encode() []byte {
	b := binary.AppendVarint(nil, p.next)
	b = binary.AppendUvarint(b, uint64(len(p.origins)))
	for o, s := range p.origins {
		b = binary.AppendUvarint(b, uint64(len(o)))
		b = append(b, o...)
		b = binary.AppendUvarint(b, s.owner)
		b = binary.AppendUvarint(b, s.seq)
		b = binary.AppendVarint(b, s.wm)
		var f byte
		if s.seen {
			f |= 1
		}
		if s.eos {
			f |= 2
		}
		b = append(b, f)
	}
	return b
}

func decodeRepartPosition(b []byte) (*repartPosition, error) {
	p := &repartPosition{origins: map[string]*originState{}}
	if b == nil {
		return p, nil
	}
	d := &repartBody{b: b}
	p.next = d.varint()
	n := d.uvarint(repartMaxOrigins)
	for range n {
		o := string(d.bytes(d.uvarint(512)))
		s := &originState{owner: d.uvarint(math.MaxInt64), seq: d.uvarint(math.MaxInt64), wm: d.varint()}
		f := d.bytes(1)
		if d.err != nil {
			break
		}
		s.seen, s.eos = f[0]&1 != 0, f[0]&2 != 0
		p.origins[o] = s
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, fmt.Errorf("pipeline: bad repartition position (%d bytes)", len(b))
	}
	return p, nil
}

// decider is the part of a scale-out follower a reader needs.
type decider interface {
	Decide(task string, ownerEpoch, epoch uint64) (scaleout.Verdict, error)
	Changed() <-chan struct{}
}

// repartSource reads one range of a keyed stage's repartition topic in
// queue order, counting a batch only once its origin's chain says it is
// valid (dropping invalid ones and retried copies) and stopping at an
// undecided one until its origin decides.
type repartSource struct {
	c      *client.Client
	group  string
	q      protocol.MessageQueue
	dec    decider
	pos    *repartPosition
	queued []protocol.MessageExt // pulled, not yet taken
	// wait, when set, is closed once a chain changes (the head batch was
	// undecided).
	wait <-chan struct{}
	// readUncommitted is the control fault: every batch counts.
	readUncommitted bool
}

// poll returns the next valid batch (its header and records), or ok false
// when none is ready (ctx ended, or the head batch is undecided: then
// s.wait is set). The batch's offset is consumed when take is called.
func (s *repartSource) poll(ctx context.Context) (h repartHeader, body *repartBody, ok bool, err error) {
	for {
		// The head batch was undecided: nothing changes until a chain
		// does (deciding it again at once would spin until its origin's
		// checkpoint is published).
		if s.wait != nil {
			select {
			case <-s.wait:
				s.wait = nil
			case <-ctx.Done():
				return h, nil, false, nil
			}
		}
		if len(s.queued) == 0 {
			res, err := s.c.Pull(ctx, client.PullRequest{Queue: s.q, Offset: s.pos.next, MaxMsgs: 64, Suspend: 5 * time.Second, Group: s.group})
			if err != nil {
				if ctx.Err() != nil {
					return h, nil, false, nil
				}
				return h, nil, false, fmt.Errorf("pull %s: %w", s.q, err)
			}
			switch res.Status {
			case client.PullOffsetIllegal:
				return h, nil, false, fmt.Errorf("%w: repartition queue %s no longer holds offset %d (it starts at %d)", scaleout.ErrSegmentGone, s.q, s.pos.next, res.MinOffset)
			case client.PullNoNewMsg, client.PullNoMatchedMsg:
				if res.NextBeginOffset > s.pos.next {
					s.pos.next = res.NextBeginOffset
				}
				return h, nil, false, nil
			}
			for _, m := range res.Messages {
				if m.QueueOffset >= s.pos.next {
					s.queued = append(s.queued, m)
				}
			}
			continue
		}
		m := &s.queued[0]
		h, body, err := decodeRepartHeader(m.Body)
		if err != nil {
			return h, nil, false, fmt.Errorf("repartition queue %s offset %d: %w", s.q, m.QueueOffset, err)
		}
		changed := s.dec.Changed()
		v, err := s.dec.Decide(h.origin, h.ownerEpoch, h.epoch)
		if s.readUncommitted {
			v, err = scaleout.Valid, nil
		}
		if err != nil {
			return h, nil, false, fmt.Errorf("decide batch of %s (owner epoch %d, epoch %d): %w", h.origin, h.ownerEpoch, h.epoch, err)
		}
		switch v {
		case scaleout.Undecided:
			s.wait = changed
			return h, nil, false, nil
		case scaleout.Unknown:
			return h, nil, false, fmt.Errorf("batch of %s (owner epoch %d, epoch %d) at %s offset %d is older than its chain's history", h.origin, h.ownerEpoch, h.epoch, s.q, m.QueueOffset)
		case scaleout.Invalid:
			s.consume()
			continue
		}
		o := s.pos.origins[h.origin]
		if o == nil {
			if len(s.pos.origins) >= repartMaxOrigins {
				return h, nil, false, fmt.Errorf("repartition queue %s: more than %d origins", s.q, repartMaxOrigins)
			}
			o = &originState{wm: activeNoWatermark}
			s.pos.origins[h.origin] = o
		}
		if o.seen && (h.ownerEpoch < o.owner || (h.ownerEpoch == o.owner && h.seq <= o.seq)) {
			s.consume() // a retried copy of a batch already taken
			continue
		}
		return h, body, true, nil
	}
}

// take consumes the batch poll returned, recording its origin's progress.
func (s *repartSource) take(h repartHeader) {
	o := s.pos.origins[h.origin]
	o.owner, o.seq, o.seen = h.ownerEpoch, h.seq, true
	o.wm = h.wm
	if h.eos {
		o.eos = true
	}
	s.consume()
}

func (s *repartSource) consume() {
	s.pos.next = s.queued[0].QueueOffset + 1
	s.queued[0] = protocol.MessageExt{}
	s.queued = s.queued[1:]
}
