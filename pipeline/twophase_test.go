package pipeline_test

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// txnStore is an in-memory transactional system: records staged per
// transaction become visible on commit.
type txnStore struct {
	mu        sync.Mutex
	staged    map[uint64][]int
	visible   []int
	committed map[uint64]bool
	recovered [][]byte
}

// tpcSink writes to a txnStore; failCommits makes Commit fail.
type tpcSink struct {
	st          *txnStore
	open        []int
	failCommits bool
}

func (s *tpcSink) Write(_ context.Context, v int) error { s.open = append(s.open, v); return nil }
func (s *tpcSink) Flush(context.Context) error          { return errors.New("Flush called on a two-phase sink") }
func (s *tpcSink) Close() error                         { return nil }

func (s *tpcSink) PreCommit(_ context.Context, id uint64) ([]byte, error) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	s.st.staged[id] = append(s.st.staged[id], s.open...)
	s.open = nil
	return binary.BigEndian.AppendUint64(nil, id), nil
}

func (s *tpcSink) Commit(_ context.Context, txn []byte) error {
	if s.failCommits {
		return errors.New("broker unavailable")
	}
	id := binary.BigEndian.Uint64(txn)
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if !s.st.committed[id] { // idempotent
		s.st.committed[id] = true
		s.st.visible = append(s.st.visible, s.st.staged[id]...)
	}
	return nil
}

func (s *tpcSink) Abort(context.Context, []byte) error { return nil }

func (s *tpcSink) Recover(_ context.Context, pending [][]byte) error {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	s.st.recovered = append(s.st.recovered, pending...)
	return nil
}

func tpcJob(dir string, in []int, sk sink.Sink[int]) *pipeline.Job {
	job := pipeline.New("tpc", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(time.Millisecond))
	src := pipeline.FromSource(job, "in", source.NewSlice(in, 2))
	pipeline.To(src, "txn-out", sk)
	return job
}

func TestPipelineTwoPhaseCommitSink(t *testing.T) {
	in := make([]int, 5000)
	for i := range in {
		in[i] = i
	}
	st := &txnStore{staged: map[uint64][]int{}, committed: map[uint64]bool{}}
	runJob(t, tpcJob(t.TempDir(), in, &tpcSink{st: st}))
	got := slices.Clone(st.visible)
	slices.Sort(got)
	if !slices.Equal(got, in) {
		t.Fatalf("visible %d records, want %d exactly once", len(got), len(in))
	}
}

// TestPipelineTwoPhaseCommitRecovery: a run whose commits fail leaves its
// transactions pending in the checkpoint; the next run recovers and commits
// them before processing anything.
func TestPipelineTwoPhaseCommitRecovery(t *testing.T) {
	dir := t.TempDir()
	in := []int{1, 2, 3, 4}
	st := &txnStore{staged: map[uint64][]int{}, committed: map[uint64]bool{}}
	err := tpcJob(dir, in, &tpcSink{st: st, failCommits: true}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "could not be committed") {
		t.Fatalf("first run: %v", err)
	}
	if len(st.visible) != 0 {
		t.Fatalf("visible before commit: %v", st.visible)
	}
	runJob(t, tpcJob(dir, in, &tpcSink{st: st}))
	if len(st.recovered) == 0 {
		t.Fatal("Recover got no pending transactions")
	}
	got := slices.Clone(st.visible)
	slices.Sort(got)
	if !slices.Equal(got, in) {
		t.Fatalf("visible %v, want %v", got, in)
	}
}

// lazySink is a tpcSink that commits in the background (sink.AsyncCommitter)
// as lazily as the contract allows: StartCommit only queues the
// transaction and WaitCommits commits the queue (or fails with failWaits).
// A runtime that treated a started commit as done would lose its records.
type lazySink struct {
	tpcSink
	queued    [][]byte
	failWaits bool
	starts    int
}

var _ sink.AsyncCommitter = (*lazySink)(nil)

func (s *lazySink) StartCommit(_ context.Context, txn []byte) error {
	s.queued = append(s.queued, txn)
	s.starts++
	return nil
}

func (s *lazySink) WaitCommits(ctx context.Context) error {
	if s.failWaits {
		return errors.New("broker unavailable")
	}
	for _, txn := range s.queued {
		if err := s.tpcSink.Commit(ctx, txn); err != nil {
			return err
		}
	}
	s.queued = nil
	return nil
}

// TestPipelineTwoPhaseCommitAsync: an AsyncCommitter's commits are started
// after each checkpoint and waited for at the next barrier and at the end.
func TestPipelineTwoPhaseCommitAsync(t *testing.T) {
	in := make([]int, 5000)
	for i := range in {
		in[i] = i
	}
	st := &txnStore{staged: map[uint64][]int{}, committed: map[uint64]bool{}}
	sk := &lazySink{tpcSink: tpcSink{st: st}}
	runJob(t, tpcJob(t.TempDir(), in, sk))
	if sk.starts == 0 {
		t.Fatal("no commit was started asynchronously")
	}
	if len(sk.queued) != 0 {
		t.Fatalf("%d started commits never waited for", len(sk.queued))
	}
	got := slices.Clone(st.visible)
	slices.Sort(got)
	if !slices.Equal(got, in) {
		t.Fatalf("visible %d records, want %d exactly once", len(got), len(in))
	}
}

// TestPipelineTwoPhaseCommitAsyncRecovery: started commits that were never
// confirmed stay pending in every checkpoint (the runtime must not record
// them as resolved), so the next run commits all of them on restore.
func TestPipelineTwoPhaseCommitAsyncRecovery(t *testing.T) {
	dir := t.TempDir()
	in := make([]int, 2000)
	for i := range in {
		in[i] = i
	}
	st := &txnStore{staged: map[uint64][]int{}, committed: map[uint64]bool{}}
	first := &lazySink{tpcSink: tpcSink{st: st}, failWaits: true}
	// Slowed down so that checkpoints complete after commits were started.
	job := pipeline.New("tpc", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(time.Millisecond))
	src := pipeline.FromSource(job, "in", source.NewSlice(in, 2))
	slow := pipeline.Map(src, "slow", func(_ context.Context, v int) (int, error) {
		if v%100 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
		return v, nil
	})
	pipeline.To(slow, "txn-out", first)
	err := job.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "could not be committed") {
		t.Fatalf("first run: %v", err)
	}
	if first.starts < 3 || len(st.visible) != 0 {
		t.Fatalf("first run: %d commits started, %d records visible", first.starts, len(st.visible))
	}
	runJob(t, tpcJob(dir, in, &lazySink{tpcSink: tpcSink{st: st}}))
	got := slices.Clone(st.visible)
	slices.Sort(got)
	if !slices.Equal(got, in) {
		t.Fatalf("visible %d records after recovery, want %d exactly once", len(got), len(in))
	}
}
