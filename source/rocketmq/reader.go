package rocketmq

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// idlePullWait is the pause after an empty pull when long polling is off,
// so that a fetcher does not spin on the broker.
const idlePullWait = 50 * time.Millisecond

// pullBackoff spaces the retries of failed pulls.
var pullBackoff = backoff.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// batch is the result of one pull, waiting in a reader's buffer.
type batch struct {
	msgs []Message
	pos  int   // next message to return
	next int64 // split offset once the whole batch is returned
}

// reader is the SplitReader of one queue. Poll, Offset,
// NotifyCheckpointComplete and Close run on the split's task goroutine; the
// fetch goroutine fills mu's buffer. The reader owns the fetch goroutine:
// Close cancels and joins it.
type reader struct {
	s   *Source
	q   protocol.MessageQueue
	id  string
	end int64 // stop offset (exclusive), -1 = none

	// Task goroutine only.
	offset   int64 // after the last record returned
	snap     int64 // offset at the last Offset call (-1 = none)
	reported int64 // last offset reported to the broker (-1 = none)
	recs     []source.Record[Message]
	offs     []byte
	closed   bool
	lagState // lag.go

	ready  chan struct{} // fetcher -> Poll: the buffer or state changed
	space  chan struct{} // Poll -> fetcher: the buffer shrank
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu struct {
		sync.Mutex
		batches []*batch
		msgs    int   // messages buffered, not yet returned
		bytes   int64 // their estimated size
		done    bool  // the fetcher stopped (end of split or err)
		err     error // why the fetcher failed
	}
}

func newReader(s *Source, q protocol.MessageQueue, id string, pos Offset) *reader {
	r := &reader{
		s: s, q: q, id: id, end: pos.End,
		offset: pos.Next, snap: -1, reported: -1,
		ready: make(chan struct{}, 1), space: make(chan struct{}, 1),
	}
	r.initLag(pos.Next)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(1)
	go r.fetch(ctx, pos.Next)
	return r
}

// Poll implements source.SplitReader: it returns up to n buffered records
// at once, or waits for the fetcher until ctx is done (returning ctx's error
// and no records). Records and their Offset slices are valid until the next
// Poll. After a fetch failure, Poll returns the records buffered before it,
// then the error.
func (r *reader) Poll(ctx context.Context, n int) ([]source.Record[Message], error) {
	if r.closed {
		return nil, ErrClosed
	}
	n = min(max(n, 1), r.s.cfg.maxMsgs)
	if need := n * encodedOffsetLen; cap(r.offs) < need {
		r.offs = make([]byte, 0, need)
	}
	for {
		r.mu.Lock()
		took := r.takeLocked(n)
		err, done := r.mu.err, r.mu.done && len(r.mu.batches) == 0
		r.mu.Unlock()
		if took {
			select {
			case r.space <- struct{}{}:
			default:
			}
		}
		switch {
		case len(r.recs) > 0:
			return r.recs, nil
		case err != nil && done:
			return nil, err
		case done || (r.end >= 0 && r.offset >= r.end):
			return nil, source.ErrEndOfSplit
		case took:
			continue // empty batches moved the offset; look again
		}
		select {
		case <-r.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// takeLocked moves up to n buffered messages into r.recs and advances
// r.offset. It reports whether it consumed anything (records or empty
// batches).
func (r *reader) takeLocked(n int) bool {
	r.recs, r.offs = r.recs[:0], r.offs[:0]
	storeTime := r.s.cfg.storeTime
	took := false
	for len(r.mu.batches) > 0 && len(r.recs) < n {
		b := r.mu.batches[0]
		for b.pos < len(b.msgs) && len(r.recs) < n {
			m := &b.msgs[b.pos]
			b.pos++
			r.offset = m.QueueOffset + 1
			start := len(r.offs)
			r.offs = Offset{Next: r.offset, End: r.end}.AppendTo(r.offs)
			et := m.BornTime
			if storeTime {
				et = m.StoreTime
			}
			r.recs = append(r.recs, source.Record[Message]{Value: *m, EventTime: et,
				Offset: r.offs[start:len(r.offs):len(r.offs)], Raw: m.Body})
			r.mu.msgs--
			r.mu.bytes -= m.size()
		}
		if b.pos == len(b.msgs) {
			r.offset = b.next
			r.mu.batches[0] = nil
			r.mu.batches = r.mu.batches[1:]
		}
		took = true
	}
	return took
}

// Offset implements source.SplitReader: the encoded Offset after the last
// record returned. The offset noted here is the one NotifyCheckpointComplete
// reports (the runtime has one checkpoint in flight at a time, so the last
// Offset call before a completion belongs to that checkpoint).
func (r *reader) Offset() []byte {
	r.snap = r.offset
	return Offset{Next: r.offset, End: r.end}.AppendTo(make([]byte, 0, encodedOffsetLen))
}

// NotifyCheckpointComplete implements source.SplitReader: it reports the
// checkpointed offset to the broker as the group's consumer offset
// (informational), unless reporting is off or the offset was reported
// already. It blocks for one round trip, at most DefaultReportTimeout.
func (r *reader) NotifyCheckpointComplete(ctx context.Context, _ uint64) error {
	r.checkpointed() // lag.go
	cfg := &r.s.cfg
	if !cfg.report || r.snap < 0 || r.snap == r.reported {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.reportTimeout)
	defer cancel()
	if err := r.s.c.CommitOffset(ctx, cfg.group, r.q, r.snap); err != nil {
		return fmt.Errorf("rocketmq source: report offset of %s: %w", r.id, err)
	}
	r.reported = r.snap
	return nil
}

// Close implements source.SplitReader: it stops and joins the fetch
// goroutine (cancelling a pull in flight). It is idempotent.
func (r *reader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	r.cancel()
	r.wg.Wait()
	return nil
}

// push appends a batch to the buffer and wakes Poll.
func (r *reader) push(b *batch) {
	r.mu.Lock()
	r.mu.batches = append(r.mu.batches, b)
	r.mu.msgs += len(b.msgs)
	for i := range b.msgs {
		r.mu.bytes += b.msgs[i].size()
	}
	r.mu.Unlock()
	r.wake()
}

// finish marks the fetcher stopped (err nil: end of split) and wakes Poll.
func (r *reader) finish(err error) {
	r.mu.Lock()
	r.mu.done, r.mu.err = true, err
	r.mu.Unlock()
	r.wake()
}

func (r *reader) wake() {
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// waitSpace blocks while the buffer is at its limits; false when ctx ended.
func (r *reader) waitSpace(ctx context.Context) bool {
	cfg := &r.s.cfg
	for {
		r.mu.Lock()
		full := r.mu.msgs >= cfg.maxMsgs || r.mu.bytes >= cfg.maxBytes
		r.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-r.space:
		case <-ctx.Done():
			return false
		}
	}
}

// fetch is the fetch goroutine: it pulls from next into the buffer until
// the split ends, a pull fails too often, or ctx (Close) ends it.
func (r *reader) fetch(ctx context.Context, next int64) {
	defer r.wg.Done()
	cfg := &r.s.cfg
	var stopMs int64
	if cfg.stop.kind == stopTimestamp {
		stopMs = cfg.stop.t.UnixMilli()
	}
	limit := func(o int64) int64 {
		if r.end >= 0 && o > r.end {
			return r.end
		}
		return o
	}
	failures := 0
	for {
		if r.end >= 0 && next >= r.end {
			r.finish(nil)
			return
		}
		if !r.waitSpace(ctx) {
			return
		}
		res, err := r.s.c.Pull(ctx, client.PullRequest{
			Queue: r.q, Offset: next, MaxMsgs: int32(cfg.batch), Suspend: cfg.pollTimeout,
			Group: cfg.group, Expression: cfg.tagExpr,
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures > cfg.retries {
				r.finish(fmt.Errorf("rocketmq source: split %s: %d consecutive pulls failed: %w", r.id, failures, err))
				return
			}
			r.s.log.Warn("rocketmq source: pull failed, retrying", "split", r.id, "offset", next, "attempt", failures, "err", err)
			if backoff.Sleep(ctx, pullBackoff.Delay(failures-1)) != nil {
				return
			}
			continue
		}
		failures = 0
		r.maxOffset.Store(res.MaxOffset) // lag.go
		switch res.Status {
		case client.PullFound:
			b := &batch{msgs: make([]Message, 0, len(res.Messages)), next: limit(res.NextBeginOffset)}
			stopped := false
			for i := range res.Messages {
				m := &res.Messages[i]
				if m.QueueOffset < next {
					continue // never return a message twice
				}
				if r.end >= 0 && m.QueueOffset >= r.end {
					b.next, stopped = r.end, true
					break
				}
				ts := m.BornTimestamp
				if cfg.storeTime {
					ts = m.StoreTimestamp
				}
				if stopMs != 0 && ts >= stopMs {
					b.next, stopped = m.QueueOffset, true
					break
				}
				b.msgs = append(b.msgs, messageFrom(m, r.q.BrokerName))
			}
			if n := len(b.msgs); n > 0 {
				b.next = max(b.next, b.msgs[n-1].QueueOffset+1)
			}
			b.next = max(b.next, next)
			r.push(b)
			next = b.next
			if stopped {
				r.finish(nil)
				return
			}
		case client.PullNoNewMsg:
			if stopMs != 0 && !time.Now().Before(cfg.stop.t.Add(cfg.stop.grace)) {
				r.finish(nil)
				return
			}
			if cfg.pollTimeout == 0 && backoff.Sleep(ctx, idlePullWait) != nil {
				return
			}
		case client.PullNoMatchedMsg:
			if o := limit(res.NextBeginOffset); o > next {
				r.push(&batch{next: o})
				next = o
			}
		case client.PullOffsetIllegal:
			reset := max(res.MinOffset, 0)
			r.s.log.Warn("rocketmq source: offset not in queue (OFFSET_MOVED), resetting to the earliest available",
				"split", r.id, "offset", next, "minOffset", res.MinOffset, "maxOffset", res.MaxOffset,
				"skipped", max(reset-next, 0))
			if reset == next {
				// The broker disagrees with itself; do not spin.
				if backoff.Sleep(ctx, pullBackoff.Delay(0)) != nil {
					return
				}
				continue
			}
			r.push(&batch{next: reset})
			next = reset
		}
	}
}
