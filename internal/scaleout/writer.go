package scaleout

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

var (
	// ErrFenced is returned when a newer owner epoch's record precedes the
	// writer's: the task belongs to someone else and nothing the writer did
	// since its last confirmed record counts.
	ErrFenced = errors.New("scaleout: task fenced by a newer owner")
	// ErrFingerprint is returned by Claim when the task's chain was written
	// by a job with another checkpoint fingerprint.
	ErrFingerprint = errors.New("scaleout: task written by a job with another fingerprint")
)

// Snapshot policy defaults.
const (
	// DefaultSnapshotEvery is how many checkpoints may follow a task's
	// latest snapshot before a new one is written.
	DefaultSnapshotEvery = 64
	// DefaultSnapshotBytes is how many bytes of changelog may follow a
	// task's latest snapshot (or the snapshot's size, if larger) before a
	// new one is written.
	DefaultSnapshotBytes = 64 << 20
)

// TaskLog names a task's queues in the job-owned topics.
type TaskLog struct {
	Task           string
	CommitTopic    string
	Commit         protocol.MessageQueue
	ChangelogTopic string
	Changelog      protocol.MessageQueue
}

// WriterConfig configures a task's Writer.
type WriterConfig struct {
	Client   *client.Client
	Producer *client.Producer
	Follower *Follower
	// Group is the job's consumer group: hints are stored as its offsets of
	// the commit queues.
	Group string
	Log   TaskLog
	// Worker names the writer in its records.
	Worker string
	// Fingerprint is the job's fingerprint hash.
	Fingerprint [32]byte
	// SnapshotEvery and SnapshotBytes set the snapshot policy (defaults
	// DefaultSnapshotEvery, DefaultSnapshotBytes).
	SnapshotEvery int
	SnapshotBytes int64
	Logger        *slog.Logger
	// SkipConfirm is a test fault (failpoint.Scaleout): Publish
	// trusts its record without reading the chain back.
	SkipConfirm bool
}

// Writer publishes one task's checkpoints as its owner. Claim creates it;
// Publish is called for every checkpoint, one at a time (the task engine's
// coordinator calls it); snapshots are written in the background. Close
// waits for a snapshot in progress.
type Writer struct {
	cfg     WriterConfig
	epoch   uint64
	history []EpochStart

	latest    *Record
	latestOff int64
	fenced    error

	snapshot     Segment
	segments     []Segment
	segmentBytes int64
	snapBytes    int64

	snap struct {
		sync.Mutex
		running bool
		done    *Segment // a finished snapshot not yet in a record
		size    int64
		err     error
	}
	wg sync.WaitGroup
}

// OwnerEpoch is the writer's owner epoch.
func (w *Writer) OwnerEpoch() uint64 { return w.epoch }

// Claim makes the caller the owner of cfg.Log.Task: it waits until the
// follower has read the task's chain to its current end, writes a claim
// with an owner epoch above every one seen and confirms it, retrying when
// another record got in first. It returns the writer and the latest valid
// record before the claim (nil for a new task): the state to restore.
func Claim(ctx context.Context, cfg WriterConfig) (*Writer, *Record, error) {
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = DefaultSnapshotEvery
	}
	if cfg.SnapshotBytes <= 0 {
		cfg.SnapshotBytes = DefaultSnapshotBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	task := cfg.Log.Task
	f := cfg.Follower
	f.Follow(task, cfg.Log.Commit)
	if err := f.Ready(ctx, task); err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		// The changelog's end is read before the commit queue's: a segment
		// there was preceded by its writer's claim, which is then below the
		// commit queue's end and in the view (see lostChain).
		changes, err := cfg.Client.MaxOffset(ctx, cfg.Log.Changelog)
		if err != nil {
			return nil, nil, fmt.Errorf("scaleout: claim %s: %w", task, err)
		}
		end, err := cfg.Client.MaxOffset(ctx, cfg.Log.Commit)
		if err != nil {
			return nil, nil, fmt.Errorf("scaleout: claim %s: %w", task, err)
		}
		if err := f.WaitPast(ctx, task, end-1); err != nil {
			return nil, nil, err
		}
		v, err := f.View(task)
		if err != nil {
			return nil, nil, err
		}
		base := v.Latest
		if base == nil && changes > 0 {
			return nil, nil, lostChain(cfg, changes)
		}
		if base != nil && base.Fingerprint != cfg.Fingerprint {
			return nil, nil, fmt.Errorf("%w: %s's latest checkpoint %d was written by worker %s of a job with another fingerprint (operators, key groups or codecs differ)", ErrFingerprint, task, base.Seq, base.Worker)
		}
		epoch := v.MaxEpoch + 1
		claim := &Record{Kind: KindClaim, Task: task, OwnerEpoch: epoch, PrevOffset: v.LatestOffset, Nonce: nonce(),
			Fingerprint: cfg.Fingerprint, Worker: cfg.Worker, TimeMs: time.Now().UnixMilli(), History: v.NextHistory(epoch)}
		if base != nil {
			claim.Seq, claim.PrevSeq = base.Seq, base.Seq
			claim.Snapshot, claim.Segments = base.Snapshot, base.Segments
		} else {
			claim.PrevOffset = -1
		}
		off, err := sendRecord(ctx, cfg, claim)
		if err != nil {
			return nil, nil, err
		}
		if err := f.WaitPast(ctx, task, off); err != nil {
			return nil, nil, err
		}
		after, err := f.View(task)
		if err != nil {
			return nil, nil, err
		}
		if after.Latest != nil && after.Latest.Nonce == claim.Nonce {
			w := &Writer{cfg: cfg, epoch: epoch, history: claim.History, latest: after.Latest, latestOff: after.LatestOffset,
				snapshot: claim.Snapshot, segments: claim.Segments}
			cfg.Logger.Info("scaleout: task claimed", "task", task, "owner epoch", epoch, "after checkpoint", claim.Seq)
			return w, base, nil
		}
		if attempt >= 20 {
			return nil, nil, fmt.Errorf("scaleout: claim %s: another record got in first %d times", task, attempt+1)
		}
		cfg.Logger.Info("scaleout: claim overtaken; retrying", "task", task, "owner epoch", epoch)
	}
}

// lostChain is Claim's error for a task whose commit chain is empty while
// changes segments were written to its changelog queue. Every segment is
// written after its writer's claim, which is on the commit queue, and
// queues only grow: the commit records were lost (the commit topic deleted
// and created again, a broker that lost them), and starting the task empty
// would replay its input from the start.
func lostChain(cfg WriterConfig, changes int64) error {
	return fmt.Errorf("%w: %s holds no record of %s, but %d messages of its state were written to its changelog queue %s: the task's commit records were lost (its commit topic deleted and created again, or the broker lost them)",
		ErrChainTruncated, cfg.Log.Commit, cfg.Log.Task, changes, cfg.Log.Changelog)
}

// sendRecord sends r to the task's commit queue, retrying transient
// failures with the same bytes (a duplicate of a record is harmless: only
// one copy can be valid), and returns the queue offset of the copy the
// broker acknowledged.
func sendRecord(ctx context.Context, cfg WriterConfig, r *Record) (int64, error) {
	body := AppendRecord(nil, r)
	q := cfg.Log.Commit
	var last error
	for attempt := range 5 {
		res, err := cfg.Producer.Send(ctx, &client.Message{Topic: cfg.Log.CommitTopic, Body: body, Queue: &q})
		if err == nil {
			return res.QueueOffset, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
		t := time.NewTimer(time.Duration(100<<attempt) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return 0, fmt.Errorf("scaleout: write commit record of %s: %w", r.Task, last)
}

// PrepareCommit marks the checkpoint with the writer's owner epoch (so a
// store knows which owner wrote its checkpoints) and asks for its batch.
func (w *Writer) PrepareCommit(c *checkpoint.Commit) {
	if c.Offsets == nil {
		c.Offsets = map[string][]byte{}
	}
	c.Offsets[OwnerEpochKey] = binary.BigEndian.AppendUint64(nil, w.epoch)
	c.CaptureBatch = true
}

// OwnerEpochKey is the offset key under which a task's store records the
// owner epoch that wrote its latest checkpoint (an empty source UID, which
// no source has).
var OwnerEpochKey = checkpoint.SplitKey("", "runnel.owner")

// Publish makes checkpoint md (whose batch c.Batch is durable in the task's
// store) count: it writes the batch to the changelog, then the commit
// record naming it, and confirms the record; only then may the task's sinks
// commit. ErrFenced means a newer owner took the task: stop it.
func (w *Writer) Publish(ctx context.Context, md checkpoint.Metadata, batch []byte, sinks []SinkTxn) error {
	if w.fenced != nil {
		return w.fenced
	}
	task := w.cfg.Log.Task
	n := nonce()
	seg, err := WriteSegment(ctx, w.cfg.Producer, w.cfg.Log.ChangelogTopic, w.cfg.Log.Changelog, task, md.ID, n, batch)
	if err != nil {
		return err
	}
	w.takeSnapshot()
	segments := append(append([]Segment(nil), w.segments...), seg)
	rec := &Record{Kind: KindCommitRecord, Task: task, OwnerEpoch: w.epoch, Seq: md.ID, PrevSeq: w.latest.Seq, PrevOffset: w.latestOff,
		Nonce: n, Fingerprint: w.cfg.Fingerprint, Worker: w.cfg.Worker, TimeMs: time.Now().UnixMilli(),
		Snapshot: w.snapshot, Segments: segments, History: w.history, Sinks: sinks}
	if len(rec.Segments) > maxSegments {
		return fmt.Errorf("scaleout: %s: %d changelog segments since the latest snapshot (snapshots failing?)", task, len(rec.Segments))
	}
	off, err := sendRecord(ctx, w.cfg, rec)
	if err != nil {
		return err
	}
	if w.cfg.SkipConfirm {
		w.latest, w.latestOff, w.segments = rec, off, segments
		return nil
	}
	f := w.cfg.Follower
	if err := f.WaitPast(ctx, task, off); err != nil {
		return err
	}
	v, err := f.View(task)
	if err != nil {
		return err
	}
	if v.Latest == nil || v.Latest.Nonce != n {
		by := "?"
		if v.Latest != nil {
			by = fmt.Sprintf("owner epoch %d of worker %s", v.Latest.OwnerEpoch, v.Latest.Worker)
		}
		w.fenced = fmt.Errorf("%w: %s checkpoint %d (owner epoch %d) is not on the chain, whose latest record is %s's", ErrFenced, task, md.ID, w.epoch, by)
		return w.fenced
	}
	w.latest, w.latestOff = v.Latest, v.LatestOffset
	w.segments = segments
	w.segmentBytes += int64(len(batch))
	// The hint lets readers that start later skip the chain's history; a
	// failure only costs them a longer read.
	if err := w.cfg.Client.CommitOffset(ctx, w.cfg.Group, w.cfg.Log.Commit, off); err != nil {
		w.cfg.Logger.Warn("scaleout: storing the commit chain hint failed", "task", task, "err", err)
	}
	return nil
}

// takeSnapshot moves a finished background snapshot into the writer's
// state (the next record names it and drops the segments it covers).
func (w *Writer) takeSnapshot() {
	w.snap.Lock()
	done, size, err := w.snap.done, w.snap.size, w.snap.err
	w.snap.done, w.snap.err = nil, nil
	w.snap.Unlock()
	if err != nil {
		w.cfg.Logger.Warn("scaleout: snapshot failed; retried after a later checkpoint", "task", w.cfg.Log.Task, "err", err)
	}
	if done == nil {
		return
	}
	w.snapshot, w.snapBytes = *done, size
	kept := w.segments[:0:0]
	var bytes int64
	for _, s := range w.segments {
		if s.Seq > done.Seq {
			kept = append(kept, s)
		}
	}
	w.segments = kept
	w.segmentBytes = bytes // the bytes of kept segments are not known exactly; start counting again
}

// MaybeSnapshot starts writing a snapshot of store in the background when
// the policy says one is due. Call it after Publish, with the store at the
// published checkpoint (nothing committed since).
func (w *Writer) MaybeSnapshot(store *checkpoint.Store) {
	due := len(w.segments) >= w.cfg.SnapshotEvery || w.segmentBytes >= max(w.cfg.SnapshotBytes, w.snapBytes)
	if !due {
		return
	}
	w.snap.Lock()
	if w.snap.running || w.snap.done != nil {
		w.snap.Unlock()
		return
	}
	w.snap.running = true
	w.snap.Unlock()
	sv, err := store.NewSavepoint()
	if err != nil {
		w.snap.Lock()
		w.snap.running, w.snap.err = false, err
		w.snap.Unlock()
		return
	}
	w.wg.Go(func() {
		defer func() { _ = sv.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		seg, size, err := w.writeSnapshot(ctx, sv)
		w.snap.Lock()
		defer w.snap.Unlock()
		w.snap.running = false
		if err != nil {
			w.snap.err = err
			return
		}
		w.snap.done, w.snap.size = &seg, size
	})
}

func (w *Writer) writeSnapshot(ctx context.Context, sv *checkpoint.Savepoint) (Segment, int64, error) {
	sw := newSegmentWriter(ctx, w.cfg.Producer, w.cfg.Log.Changelog, w.cfg.Log.ChangelogTopic, w.cfg.Log.Task, sv.Metadata().ID, nonce())
	cw := &countingWriter{w: sw}
	if err := sv.WriteTo(ctx, cw); err != nil {
		return Segment{}, 0, err
	}
	seg, err := sw.finish()
	return seg, cw.n, err
}

// Close waits for a snapshot in progress (its store must stay open until
// then).
func (w *Writer) Close() error {
	w.wg.Wait()
	return nil
}

type countingWriter struct {
	w interface{ Write([]byte) (int, error) }
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func nonce() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
