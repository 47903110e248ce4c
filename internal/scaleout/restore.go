package scaleout

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/transport/client"
)

// ErrStaleLocalState is returned by Restore when the task's directory holds
// checkpoints but the broker has no commit chain for the task: the job's
// topics were deleted or the broker lost them. Starting empty would replay
// the input from the start (duplicating output), so Restore refuses; delete
// the directory to start the task afresh.
var ErrStaleLocalState = errors.New("scaleout: local state of a task the broker has no chain for")

// RestoreReport says how Restore brought a task's store to its checkpoint.
type RestoreReport struct {
	// Reused: the directory already held the checkpoint.
	Reused bool
	// FromSnapshot: the store was rebuilt from the broker's snapshot.
	FromSnapshot bool
	// Applied is how many changelog segments were applied.
	Applied int
	// Bytes is how many changelog bytes were read.
	Bytes int64
}

// Restore brings the task store in dir to base, the latest valid record of
// the task before its new owner's claim (nil: a new task; dir must hold no
// checkpoint), as judged by chain. It keeps what dir holds when its latest
// checkpoint lies on the chain (a restart on the same disk, or a standby's
// copy) and applies only the segments after it; otherwise it rebuilds dir
// from base's snapshot and segments. It fails with ErrSegmentGone when the
// broker no longer has what it needs.
func Restore(ctx context.Context, c *client.Client, group string, log TaskLog, dir string, base *Record, chain View, opts checkpoint.Options) (RestoreReport, error) {
	var rep RestoreReport
	at, epoch, ok, err := localCheckpoint(dir, opts)
	if err != nil {
		return rep, err
	}
	if base == nil {
		if ok {
			return rep, fmt.Errorf("%w: %s holds checkpoint %d of task %s", ErrStaleLocalState, dir, at, log.Task)
		}
		return rep, nil
	}
	var from uint64 // apply segments after this checkpoint
	usable := ok && at <= base.Seq && chain.Decide(epoch, at) == Valid && (at >= base.Snapshot.Seq)
	if usable && at < base.Seq {
		// Every checkpoint after at must be a listed segment.
		usable = coversAfter(base.Segments, at, base.Seq)
	}
	if usable {
		from = at
		rep.Reused = true
	} else {
		if base.Snapshot.Seq > 0 {
			from = base.Snapshot.Seq
		}
		if !coversAfter(base.Segments, from, base.Seq) {
			return rep, fmt.Errorf("%w: %s: the latest record (checkpoint %d) does not list every segment after checkpoint %d", ErrSegmentGone, log.Task, base.Seq, from)
		}
	}
	var segs []Segment
	for _, seg := range base.Segments {
		if seg.Seq > from {
			segs = append(segs, seg)
		}
	}
	// The segments are pulled while the snapshot loads, and the next ones
	// while one is applied.
	pf := prefetchSegments(ctx, c, group, log, segs)
	defer pf.close()
	if !usable {
		if err := os.RemoveAll(dir); err != nil {
			return rep, fmt.Errorf("scaleout: clear %s: %w", dir, err)
		}
		if base.Snapshot.Seq > 0 {
			sr := NewSegmentReader(ctx, c, group, log.Changelog, log.Task, base.Snapshot)
			cr := &countingReader{r: sr}
			err := checkpoint.IngestSavepoint(ctx, dir, cr, opts)
			if err != nil && sr.err != nil {
				// The savepoint reader reports a broken stream as corrupt;
				// what broke it (ErrSegmentGone: the snapshot's messages
				// are gone) is the reader's error.
				err = sr.err
			}
			_ = sr.Close()
			if err != nil {
				return rep, fmt.Errorf("scaleout: restore snapshot of %s (checkpoint %d): %w", log.Task, base.Snapshot.Seq, err)
			}
			rep.FromSnapshot, rep.Bytes = true, cr.n
		}
	}
	if from == base.Seq {
		return rep, nil
	}
	s, err := checkpoint.Open(dir, opts)
	if err != nil {
		return rep, err
	}
	defer func() { _ = s.Close() }()
	for f := range pf.ch {
		if f.err != nil {
			return rep, f.err
		}
		if _, err := s.ApplyBatch(f.data, false); err != nil {
			return rep, fmt.Errorf("scaleout: %s: apply checkpoint %d: %w", log.Task, f.seq, err)
		}
		rep.Applied++
		rep.Bytes += int64(len(f.data))
		pf.release(f)
	}
	if m, ok := s.Latest(); !ok || m.ID != base.Seq {
		return rep, fmt.Errorf("scaleout: %s: restored to checkpoint %d, want %d", log.Task, m.ID, base.Seq)
	}
	return rep, s.Close()
}

// prefetchBytes bounds the segments a restore holds read ahead of the one
// it applies, estimated from their ranges (a single larger segment is read
// alone).
const prefetchBytes = 32 << 20

// segmentPrefetch reads a restore's segments, in order, on a goroutine of
// its own, up to prefetchBytes ahead of the one being applied.
type segmentPrefetch struct {
	ch     chan fetchedSegment
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	freed   *sync.Cond
	held    int64 // estimated bytes read and not yet released
	stopped bool
}

type fetchedSegment struct {
	seq  uint64
	data []byte
	est  int64 // what it holds of the budget
	err  error // the last one sent
}

func prefetchSegments(ctx context.Context, c *client.Client, group string, log TaskLog, segs []Segment) *segmentPrefetch {
	ctx, cancel := context.WithCancel(ctx)
	pf := &segmentPrefetch{ch: make(chan fetchedSegment, len(segs)), cancel: cancel, done: make(chan struct{})}
	pf.freed = sync.NewCond(&pf.mu)
	go func() {
		defer close(pf.done)
		defer close(pf.ch)
		for _, seg := range segs {
			est := (seg.To - seg.From) * ChunkSize
			if !pf.acquire(est) {
				return
			}
			data, err := ReadSegment(ctx, c, group, log.Changelog, log.Task, seg)
			pf.ch <- fetchedSegment{seq: seg.Seq, data: data, est: est, err: err} // never blocks: one slot per segment
			if err != nil {
				return
			}
		}
	}()
	return pf
}

// acquire waits until est more bytes fit in the budget (or nothing is
// held); false when the prefetch was closed.
func (pf *segmentPrefetch) acquire(est int64) bool {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	for pf.held > 0 && pf.held+est > prefetchBytes && !pf.stopped {
		pf.freed.Wait()
	}
	pf.held += est
	return !pf.stopped
}

// release gives back what an applied segment held.
func (pf *segmentPrefetch) release(f fetchedSegment) {
	pf.mu.Lock()
	pf.held -= f.est
	pf.mu.Unlock()
	pf.freed.Signal()
}

// close stops the reading and joins the goroutine.
func (pf *segmentPrefetch) close() {
	pf.cancel()
	pf.mu.Lock()
	pf.stopped = true
	pf.mu.Unlock()
	pf.freed.Broadcast()
	for range pf.ch {
	}
	<-pf.done
}

// coversAfter reports whether segs (in seq order) hold segments up to
// checkpoint to after from: some segment follows from and the last is to's.
// That they form an unbroken sequence is checked as they are applied: each
// batch names its predecessor (checkpoint.ApplyBatch refuses a gap).
func coversAfter(segs []Segment, from, to uint64) bool {
	if from == to {
		return true
	}
	n := 0
	var last uint64
	for _, s := range segs {
		if s.Seq > from {
			n++
			last = s.Seq
		}
	}
	return n > 0 && last == to
}

// localCheckpoint reads dir's latest checkpoint and the owner epoch that
// wrote it (ok false when dir holds none).
func localCheckpoint(dir string, opts checkpoint.Options) (id, epoch uint64, ok bool, err error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return 0, 0, false, nil
	}
	s, err := checkpoint.Open(dir, opts)
	if err != nil {
		if errors.Is(err, checkpoint.ErrIncompleteRestore) || errors.Is(err, checkpoint.ErrCorrupt) {
			return 0, 0, false, os.RemoveAll(dir) // rebuilt from the broker
		}
		return 0, 0, false, err
	}
	defer func() { _ = s.Close() }()
	m, ok := s.Latest()
	if !ok {
		return 0, 0, false, nil
	}
	offs, err := s.Offsets()
	if err != nil {
		return 0, 0, false, err
	}
	if b := offs[OwnerEpochKey]; len(b) == 8 {
		epoch = binary.BigEndian.Uint64(b)
	}
	return m.ID, epoch, true, nil
}

type countingReader struct {
	r interface{ Read([]byte) (int, error) }
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}
