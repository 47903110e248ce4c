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

func tpcJob(dir string, in []int, sk *tpcSink) *pipeline.Job {
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
