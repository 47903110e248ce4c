package sinktest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/sink/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// store is an in-memory transactional system: committed records and
// prepared transactions that survive the sink instances writing to it.
type store struct {
	idempotent bool // committing a key again overwrites it

	mu struct {
		sync.Mutex
		committed []string
		prepared  map[string][]string // transaction id -> keys
		done      map[string][]string // committed transaction id -> keys
		runs      int
	}
}

func newStore(idempotent bool) *store {
	st := &store{idempotent: idempotent}
	st.mu.prepared = map[string][]string{}
	st.mu.done = map[string][]string{}
	return st
}

func (st *store) commitLocked(keys []string) {
	for _, k := range keys {
		if st.idempotent && slices.Contains(st.mu.committed, k) {
			continue
		}
		st.mu.committed = append(st.mu.committed, k)
	}
}

func (st *store) visible(context.Context) ([]string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.mu.committed), nil
}

func (st *store) open(context.Context) (int, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.mu.prepared), nil
}

// memSink is a two-phase-commit sink on a store: correct unless bug names
// a deliberate breach of the contract. A transaction's description is its
// id, "run/checkpoint".
type memSink struct {
	st      *store
	bug     string
	run     string
	buf     []string
	local   map[string][]string // forgets-prepared: prepared only in memory
	started [][]byte            // StartCommit'ed, not yet waited for
	closed  bool
}

var (
	_ sink.TwoPhaseCommit[string] = (*memSink)(nil)
	_ sink.AsyncCommitter         = (*memSink)(nil)
)

func newMemSink(st *store, bug string) *memSink {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.mu.runs++
	return &memSink{st: st, bug: bug, run: "run" + strconv.Itoa(st.mu.runs), local: map[string][]string{}}
}

func (s *memSink) Write(_ context.Context, k string) error {
	s.buf = append(s.buf, k)
	return nil
}

func (s *memSink) Flush(context.Context) error {
	if s.bug == "flush-noop" {
		return nil
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	s.st.commitLocked(s.buf)
	if s.bug != "flush-keeps" {
		s.buf = nil
	}
	return nil
}

func (s *memSink) PreCommit(_ context.Context, id uint64) ([]byte, error) {
	txn := s.run + "/" + strconv.FormatUint(id, 10)
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	switch s.bug {
	case "visible-at-precommit":
		s.st.commitLocked(s.buf)
		s.st.mu.done[txn] = s.buf
	case "forgets-prepared":
		s.local[txn] = s.buf
	default:
		s.st.mu.prepared[txn] = s.buf
	}
	s.buf = nil
	return []byte(txn), nil
}

func (s *memSink) Commit(_ context.Context, txn []byte) error {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.commitLocked(string(txn))
}

func (s *memSink) commitLocked(txn string) error {
	st := s.st
	if s.bug == "commit-all-prepared" {
		for id, keys := range st.mu.prepared {
			st.commitLocked(keys)
			st.mu.done[id] = keys
			delete(st.mu.prepared, id)
		}
	}
	if keys, ok := s.local[txn]; ok && s.bug == "forgets-prepared" {
		st.commitLocked(keys)
		delete(s.local, txn)
		st.mu.done[txn] = keys
		return nil
	}
	if keys, ok := st.mu.prepared[txn]; ok {
		st.commitLocked(keys)
		delete(st.mu.prepared, txn)
		st.mu.done[txn] = keys
		return nil
	}
	if keys, ok := st.mu.done[txn]; ok {
		if s.bug == "commit-not-idempotent" {
			st.commitLocked(keys)
		}
		return nil
	}
	if s.bug == "forgets-prepared" {
		return nil // silently: the records are lost
	}
	return fmt.Errorf("memsink: transaction %s is lost", txn)
}

func (s *memSink) Abort(_ context.Context, txn []byte) error {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if s.bug == "abort-commits" {
		return s.commitLocked(string(txn))
	}
	if _, ok := s.st.mu.done[string(txn)]; ok {
		return fmt.Errorf("memsink: abort of committed transaction %s", txn)
	}
	delete(s.st.mu.prepared, string(txn))
	return nil
}

func (s *memSink) Recover(_ context.Context, pending [][]byte) error {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	keep := map[string]bool{}
	for _, p := range pending {
		keep[string(p)] = s.bug != "recover-drops-pending"
	}
	if s.bug == "recover-keeps-others" {
		return nil
	}
	for id := range s.st.mu.prepared {
		if !keep[id] {
			delete(s.st.mu.prepared, id)
		}
	}
	return nil
}

func (s *memSink) StartCommit(_ context.Context, txn []byte) error {
	s.started = append(s.started, txn)
	return nil
}

func (s *memSink) WaitCommits(context.Context) error {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	started := s.started
	s.started = nil
	if s.bug == "async-never-commits" {
		return nil
	}
	for _, txn := range started {
		if err := s.commitLocked(string(txn)); err != nil {
			return err
		}
	}
	return nil
}

func (s *memSink) Close() error {
	if s.closed {
		return errors.New("memsink: closed twice")
	}
	s.closed = true
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if s.bug == "close-commits" {
		for id, keys := range s.st.mu.prepared {
			if strings.HasPrefix(id, s.run+"/") {
				s.st.commitLocked(keys)
				delete(s.st.mu.prepared, id)
				s.st.mu.done[id] = keys
			}
		}
	}
	if s.bug == "close-fails" {
		return errors.New("memsink: close failed")
	}
	return nil
}

// plainSink hides memSink's two-phase-commit methods: a plain sink.Sink.
type plainSink struct{ s *memSink }

func (p plainSink) Write(ctx context.Context, k string) error { return p.s.Write(ctx, k) }
func (p plainSink) Flush(ctx context.Context) error           { return p.s.Flush(ctx) }
func (p plainSink) Close() error                              { return p.s.Close() }

// memFactory makes Systems of memSinks with bug.
func memFactory(bug string, plain, idempotent bool) sinktest.Factory[string] {
	return func(*testing.T) sinktest.System[string] {
		st := newStore(idempotent)
		return sinktest.System[string]{
			New: func(context.Context) (sink.Sink[string], error) {
				s := newMemSink(st, bug)
				if plain {
					return plainSink{s}, nil
				}
				return s, nil
			},
			Record:  func(k string) string { return k },
			Visible: st.visible,
			Open:    st.open,
		}
	}
}

// TestSuitePassesCorrectSinks runs the suites on correct in-memory sinks.
func TestSuitePassesCorrectSinks(t *testing.T) {
	t.Run("TwoPhaseCommit", func(t *testing.T) {
		sinktest.RunTwoPhaseCommit(t, sinktest.Features{}, memFactory("", false, false))
	})
	t.Run("Plain", func(t *testing.T) {
		sinktest.Run(t, sinktest.Features{}, memFactory("", true, false))
	})
	t.Run("PlainIdempotent", func(t *testing.T) {
		sinktest.Run(t, sinktest.Features{Idempotent: true}, memFactory("", true, true))
	})
}

// brokenCases are the deliberately broken sinks, each with the check that
// must catch it and a part of the failure message.
var brokenCases = []struct {
	bug        string
	plain      bool // run the plain suite
	idempotent bool // the store overwrites
	features   sinktest.Features
	check      string
	message    string
}{
	{bug: "visible-at-precommit", check: "CommitMakesVisible", message: "after PreCommit, before Commit: Visible shows"},
	{bug: "commit-not-idempotent", check: "CommitIdempotent", message: "too often"},
	{bug: "commit-all-prepared", check: "LateCommit", message: "must not be visible"},
	{bug: "abort-commits", check: "Abort", message: "after Abort: Visible shows"},
	{bug: "forgets-prepared", features: sinktest.Features{Timeout: 300 * time.Millisecond}, check: "CrashBeforeCommit", message: "missing"},
	{bug: "close-commits", check: "CrashBeforeCommit", message: "after the instance that pre-committed was closed"},
	{bug: "recover-drops-pending", check: "CrashBeforeCommit", message: "is lost"},
	{bug: "recover-keeps-others", check: "RecoverAbortsOthers", message: "open transactions of the sink",
		features: sinktest.Features{Timeout: 300 * time.Millisecond}},
	{bug: "async-never-commits", check: "AsyncCommit", message: "after WaitCommits of checkpoint 1",
		features: sinktest.Features{Timeout: 300 * time.Millisecond}},
	{bug: "close-fails", check: "CommitMakesVisible", message: "Close: memsink: close failed"},
	{bug: "flush-noop", plain: true, check: "FlushMakesVisible", message: "missing",
		features: sinktest.Features{Timeout: 300 * time.Millisecond}},
	{bug: "flush-keeps", plain: true, check: "FlushMakesVisible", message: "too often"},
	// A sink declared idempotent whose replays add copies.
	{plain: true, features: sinktest.Features{Idempotent: true}, check: "Replay", message: "too often"},
}

const brokenEnv = "SINKTEST_BROKEN"

// TestSuiteCatchesBrokenSinks runs the suites on every broken sink in a
// child process (a failing suite fails its test, which this test cannot
// contain) and checks that the child fails, in the check that names the
// breach, with its message.
func TestSuiteCatchesBrokenSinks(t *testing.T) {
	for i, c := range brokenCases {
		name := fmt.Sprintf("%d-%s", i, c.bug)
		t.Run(name, func(t *testing.T) {
			t.Parallel() // mostly waiting: quiet periods and timeouts
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenSink$", "-test.v", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+strconv.Itoa(i))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed a sink with bug %q (err %v):\n%s", c.bug, err, out)
			}
			if want := "--- FAIL: TestBrokenSink/" + c.check + " "; !strings.Contains(string(out), want) {
				t.Fatalf("bug %q: no %q in the output:\n%s", c.bug, want, out)
			}
			if !strings.Contains(string(out), c.message) {
				t.Fatalf("bug %q: no %q in the output:\n%s", c.bug, c.message, out)
			}
		})
	}
}

// TestBrokenSink is the child of TestSuiteCatchesBrokenSinks.
func TestBrokenSink(t *testing.T) {
	v := os.Getenv(brokenEnv)
	if v == "" {
		t.Skip("run by TestSuiteCatchesBrokenSinks")
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 || i >= len(brokenCases) {
		t.Fatalf("%s=%q", brokenEnv, v)
	}
	c := brokenCases[i]
	if c.plain {
		sinktest.Run(t, c.features, memFactory(c.bug, true, c.idempotent))
		return
	}
	sinktest.RunTwoPhaseCommit(t, c.features, memFactory(c.bug, false, c.idempotent))
}
