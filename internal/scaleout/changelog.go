package scaleout

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// ChunkSize is the most data one changelog message carries.
const ChunkSize = 1 << 20

// maxChunks bounds the chunks of one segment a reader assembles (4 GiB).
const maxChunks = 4096

// chunkMagic starts every changelog message; the byte after it is the
// format version.
var chunkMagic = [2]byte{'R', 'L'}

const chunkVersion = 1

// ErrSegmentGone is returned (wrapped, with the task and range) when a
// changelog segment a restore needs is no longer on the broker (retention
// deleted it) or is incomplete: the task's state cannot be rebuilt.
var ErrSegmentGone = errors.New("scaleout: changelog segment missing")

// chunkHeader tags one changelog message.
type chunkHeader struct {
	task  string
	seq   uint64
	nonce uint64
	index uint32
	last  bool
}

func appendChunk(dst []byte, h chunkHeader, data []byte) []byte {
	dst = append(dst, chunkMagic[0], chunkMagic[1], chunkVersion)
	dst = appendStr(dst, h.task)
	dst = binary.AppendUvarint(dst, h.seq)
	dst = binary.BigEndian.AppendUint64(dst, h.nonce)
	dst = binary.AppendUvarint(dst, uint64(h.index))
	if h.last {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	return append(dst, data...)
}

func decodeChunk(b []byte) (chunkHeader, []byte, error) {
	if len(b) < 3 || b[0] != chunkMagic[0] || b[1] != chunkMagic[1] || b[2] != chunkVersion {
		return chunkHeader{}, nil, errors.New("scaleout: not a changelog chunk")
	}
	d := decoder{b: b[3:]}
	h := chunkHeader{task: d.str("task", maxTaskLen), seq: d.uvarint("seq", 1<<62), nonce: d.u64("nonce"),
		index: uint32(d.uvarint("chunk index", maxChunks))}
	last := d.bytes("last flag", 1)
	if d.err != nil {
		return chunkHeader{}, nil, d.err
	}
	h.last = last[0] == 1
	return h, d.b, nil
}

// segmentWriter writes one segment's chunks to a changelog queue.
type segmentWriter struct {
	ctx   context.Context
	p     *client.Producer
	q     protocol.MessageQueue
	topic string
	hdr   chunkHeader
	buf   []byte
	from  int64
	to    int64
	err   error
}

func newSegmentWriter(ctx context.Context, p *client.Producer, q protocol.MessageQueue, topic, task string, seq, nonce uint64) *segmentWriter {
	return &segmentWriter{ctx: ctx, p: p, q: q, topic: topic, hdr: chunkHeader{task: task, seq: seq, nonce: nonce}, from: -1}
}

// Write buffers data, sending a chunk each ChunkSize bytes (io.Writer, for
// the savepoint stream of a snapshot).
func (w *segmentWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 && w.err == nil {
		room := ChunkSize - len(w.buf)
		take := min(room, len(b))
		w.buf = append(w.buf, b[:take]...)
		b = b[take:]
		if len(w.buf) == ChunkSize {
			w.send(false)
		}
	}
	if w.err != nil {
		return 0, w.err
	}
	return n, nil
}

// Close sends the last chunk and returns the segment.
func (w *segmentWriter) finish() (Segment, error) {
	w.send(true)
	if w.err != nil {
		return Segment{}, w.err
	}
	return Segment{Seq: w.hdr.seq, Nonce: w.hdr.nonce, From: w.from, To: w.to + 1}, nil
}

func (w *segmentWriter) send(last bool) {
	if w.err != nil {
		return
	}
	w.hdr.last = last
	body := appendChunk(make([]byte, 0, len(w.buf)+64), w.hdr, w.buf)
	q := w.q
	res, err := w.p.Send(w.ctx, &client.Message{Topic: w.topic, Body: body, Queue: &q})
	if err != nil {
		w.err = fmt.Errorf("scaleout: changelog %s of %s: %w", w.topic, w.hdr.task, err)
		return
	}
	if w.from < 0 || res.QueueOffset < w.from {
		w.from = res.QueueOffset
	}
	w.to = max(w.to, res.QueueOffset)
	w.hdr.index++
	w.buf = w.buf[:0]
}

// WriteSegment sends data as one changelog segment of task's checkpoint
// seq (tagged with nonce) to queue q of topic, one synchronous send per
// chunk (so chunks of one writer are in order), and returns its range.
func WriteSegment(ctx context.Context, p *client.Producer, topic string, q protocol.MessageQueue, task string, seq, nonce uint64, data []byte) (Segment, error) {
	w := newSegmentWriter(ctx, p, q, topic, task, seq, nonce)
	for len(data) > ChunkSize {
		w.buf = append(w.buf[:0], data[:ChunkSize]...)
		data = data[ChunkSize:]
		w.send(false)
	}
	w.buf = append(w.buf[:0], data...)
	return w.finish()
}

// pullDepth is how many pulls a SegmentReader keeps in flight, at
// successive offsets of its range. A broker caps a pull's response by bytes
// (256 KiB) but always returns one message, so a 1 MiB chunk comes one per
// round trip; with one pull at a time a restore read 27-46 MiB/s on the
// 2-core development machine. The responses wait in offset order: at most
// pullDepth of them (about pullDepth MiB) are held.
const pullDepth = 8

// SegmentReader streams the data of one segment: the chunks of the
// segment's writer (task, seq, nonce) among the messages [From, To) of its
// queue, in chunk order. Other writers' chunks (a fenced former owner's, a
// retried write's duplicates) are skipped. It fails with ErrSegmentGone
// when the range is no longer on the broker or the chunks are incomplete.
// It keeps up to pullDepth pulls in flight on goroutines of its own, which
// it joins when it reaches the end or an error; Close joins them when the
// caller stops before.
type SegmentReader struct {
	ctx    context.Context
	cancel context.CancelFunc
	c      *client.Client
	group  string
	q      protocol.MessageQueue
	task   string
	seg    Segment

	next   int64       // next queue offset to read
	issued int64       // next queue offset to pull
	window []*pullSlot // pulls in offset order, the first at next
	wg     sync.WaitGroup
	// inFlight bounds the pulls started and not finished, the window's and
	// those a response made redundant, to 2 * pullDepth.
	inFlight chan struct{}
	want     uint32 // next chunk index
	pending  []byte // data of the current chunk not yet read
	ahead    map[uint32]chunk
	done     bool
	err      error
}

// pullSlot is one pull in flight; done is closed when res or err is set.
type pullSlot struct {
	off  int64
	done chan struct{}
	res  *client.PullResult
	err  error
}

// NewSegmentReader reads seg of task from changelog queue q.
func NewSegmentReader(ctx context.Context, c *client.Client, group string, q protocol.MessageQueue, task string, seg Segment) *SegmentReader {
	ctx, cancel := context.WithCancel(ctx)
	return &SegmentReader{ctx: ctx, cancel: cancel, c: c, group: group, q: q, task: task, seg: seg,
		next: seg.From, issued: seg.From, ahead: map[uint32]chunk{}, inFlight: make(chan struct{}, 2*pullDepth)}
}

// chunk is a chunk read ahead of its turn.
type chunk struct {
	data []byte
	last bool
}

// Read implements io.Reader.
func (r *SegmentReader) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.done {
			return 0, io.EOF
		}
		r.fill()
		if r.err != nil || r.done {
			r.Close()
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// Close stops the pulls in flight and waits for them. The reader returns
// what it already holds, then an error.
func (r *SegmentReader) Close() error {
	r.cancel()
	r.wg.Wait()
	r.window = nil
	if r.err == nil && !r.done {
		r.err = fmt.Errorf("scaleout: read changelog of %s: reader closed", r.task)
	}
	return nil
}

// pull returns the first pull of the window (at r.next), after starting
// pulls up to pullDepth ahead.
func (r *SegmentReader) pull() *pullSlot {
	for len(r.window) > 0 && r.window[0].off < r.next {
		r.window = r.window[1:] // a response covered it; its pull is joined by Close
	}
	if len(r.window) > 0 && r.window[0].off != r.next {
		r.window = nil
	}
	if len(r.window) == 0 {
		r.issued = r.next
	}
	for len(r.window) < pullDepth && r.issued < r.seg.To {
		sl := &pullSlot{off: r.issued, done: make(chan struct{})}
		r.issued++
		r.window = append(r.window, sl)
		r.inFlight <- struct{}{} // the window holds < pullDepth: a redundant pull ends
		r.wg.Go(func() {
			defer func() { <-r.inFlight }()
			defer close(sl.done)
			sl.res, sl.err = pullWithRetry(r.ctx, r.c, client.PullRequest{Queue: r.q, Offset: sl.off, MaxMsgs: 16, Group: r.group})
		})
	}
	sl := r.window[0]
	r.window = r.window[1:]
	return sl
}

// fill makes the next chunk's data pending, pulling as needed.
func (r *SegmentReader) fill() {
	if ch, ok := r.ahead[r.want]; ok {
		delete(r.ahead, r.want)
		r.want++
		r.done = ch.last
		r.pending = ch.data
		return
	}
	if r.next >= r.seg.To {
		r.err = fmt.Errorf("%w: task %s checkpoint %d: chunk %d not in [%d, %d) of %s", ErrSegmentGone, r.task, r.seg.Seq, r.want, r.seg.From, r.seg.To, r.q)
		return
	}
	sl := r.pull()
	<-sl.done // pullWithRetry returns when r.ctx ends
	res, err := sl.res, sl.err
	if err != nil {
		r.err = fmt.Errorf("scaleout: read changelog of %s: %w", r.task, err)
		return
	}
	switch res.Status {
	case client.PullOffsetIllegal:
		why := "retention (or a deletion) removed it"
		if res.MinOffset <= sl.off {
			why = "the queue is shorter than the record says: the topic was deleted and created again, or the broker lost messages"
		}
		r.err = fmt.Errorf("%w: task %s checkpoint %d: [%d, %d) of %s is gone (the queue holds [%d, %d)): %s", ErrSegmentGone, r.task, r.seg.Seq, r.seg.From, r.seg.To, r.q, res.MinOffset, res.MaxOffset, why)
		return
	case client.PullNoNewMsg, client.PullNoMatchedMsg:
		if res.NextBeginOffset > r.next {
			r.next = res.NextBeginOffset
			return
		}
		r.err = fmt.Errorf("%w: task %s checkpoint %d: [%d, %d) of %s not readable (the queue ends at %d: the topic was deleted and created again, or the broker lost messages)", ErrSegmentGone, r.task, r.seg.Seq, r.seg.From, r.seg.To, r.q, res.MaxOffset)
		return
	}
	for i := range res.Messages {
		m := &res.Messages[i]
		if m.QueueOffset < r.next {
			continue
		}
		if m.QueueOffset >= r.seg.To {
			r.next = r.seg.To
			break
		}
		r.next = m.QueueOffset + 1
		h, data, err := decodeChunk(m.Body)
		if err != nil || h.task != r.task || h.seq != r.seg.Seq || h.nonce != r.seg.Nonce || h.index < r.want {
			continue
		}
		r.ahead[h.index] = chunk{data: data, last: h.last}
		if len(r.ahead) > maxChunks {
			r.err = fmt.Errorf("%w: task %s checkpoint %d: over %d chunks out of order", ErrSegmentGone, r.task, r.seg.Seq, maxChunks)
			return
		}
	}
}

// ReadSegment reads a whole segment into memory.
func ReadSegment(ctx context.Context, c *client.Client, group string, q protocol.MessageQueue, task string, seg Segment) ([]byte, error) {
	r := NewSegmentReader(ctx, c, group, q, task, seg)
	defer func() { _ = r.Close() }()
	return io.ReadAll(r)
}

// pullWithRetry pulls, retrying transient errors a few times.
func pullWithRetry(ctx context.Context, c *client.Client, req client.PullRequest) (*client.PullResult, error) {
	var last error
	for attempt := range 5 {
		res, err := c.Pull(ctx, req)
		if err == nil {
			return res, nil
		}
		last = err
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		t := time.NewTimer(time.Duration(50<<attempt) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	return nil, last
}
