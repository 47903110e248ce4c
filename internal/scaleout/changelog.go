package scaleout

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

// SegmentReader streams the data of one segment: the chunks of the
// segment's writer (task, seq, nonce) among the messages [From, To) of its
// queue, in chunk order. Other writers' chunks (a fenced former owner's, a
// retried write's duplicates) are skipped. It fails with ErrSegmentGone
// when the range is no longer on the broker or the chunks are incomplete.
type SegmentReader struct {
	ctx   context.Context
	c     *client.Client
	group string
	q     protocol.MessageQueue
	task  string
	seg   Segment

	next    int64  // next queue offset to pull
	want    uint32 // next chunk index
	pending []byte // data of the current chunk not yet read
	ahead   map[uint32]chunk
	done    bool
	err     error
}

// NewSegmentReader reads seg of task from changelog queue q.
func NewSegmentReader(ctx context.Context, c *client.Client, group string, q protocol.MessageQueue, task string, seg Segment) *SegmentReader {
	return &SegmentReader{ctx: ctx, c: c, group: group, q: q, task: task, seg: seg, next: seg.From, ahead: map[uint32]chunk{}}
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
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
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
	res, err := pullWithRetry(r.ctx, r.c, client.PullRequest{Queue: r.q, Offset: r.next, MaxMsgs: 16, Group: r.group})
	if err != nil {
		r.err = fmt.Errorf("scaleout: read changelog of %s: %w", r.task, err)
		return
	}
	switch res.Status {
	case client.PullOffsetIllegal:
		why := "retention (or a deletion) removed it"
		if res.MinOffset <= r.next {
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
		if m.QueueOffset >= r.seg.To {
			r.next = r.seg.To
			break
		}
		r.next = m.QueueOffset + 1
		h, data, err := decodeChunk(m.Body)
		if err != nil || h.task != r.task || h.seq != r.seg.Seq || h.nonce != r.seg.Nonce || h.index < r.want {
			continue
		}
		r.ahead[h.index] = chunk{data: append([]byte(nil), data...), last: h.last}
		if len(r.ahead) > maxChunks {
			r.err = fmt.Errorf("%w: task %s checkpoint %d: over %d chunks out of order", ErrSegmentGone, r.task, r.seg.Seq, maxChunks)
			return
		}
	}
}

// ReadSegment reads a whole segment into memory.
func ReadSegment(ctx context.Context, c *client.Client, group string, q protocol.MessageQueue, task string, seg Segment) ([]byte, error) {
	return io.ReadAll(NewSegmentReader(ctx, c, group, q, task, seg))
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
