package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/runnel-dev/runnel/checkpoint/internal/storefs"
)

var crashSeed = flag.Uint64("crash.seed", 0, "seed of the crash tests (0: random, printed)")

func seed(t *testing.T) uint64 {
	s := *crashSeed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crash.seed=%d)", s, s)
	return s
}

// commitFunc commits c to s; the real one is Store.Commit, the controls are
// broken on purpose.
type commitFunc func(s *Store, c *Commit) error

func realCommit(s *Store, c *Commit) error {
	_, err := s.Commit(context.Background(), c)
	return err
}

// splitCommit is a CONTROL: it writes the state changes in one synced batch
// and the offsets, pending records and metadata in a second one. A crash
// between the two leaves a mix of checkpoints, which the check must catch.
func splitCommit(s *Store, c *Commit) error {
	b := s.db.NewBatch()
	w := &Writer{s: s, b: b, live: true}
	s.writing = true
	for _, p := range c.Parts {
		if err := p.WriteTo(w); err != nil {
			return err
		}
	}
	s.writing = false
	if err := b.Commit(pebble.Sync); err != nil {
		return err
	}
	_ = b.Close()
	_, err := s.Commit(context.Background(), &Commit{ID: c.ID, Offsets: c.Offsets, Pending: c.Pending, Resolved: c.Resolved})
	return err
}

// unsyncedCommit is a CONTROL: the right batch, committed without fsync. A
// crash loses checkpoints that were reported complete.
func unsyncedCommit(s *Store, c *Commit) error {
	b := s.db.NewBatch()
	w := &Writer{s: s, b: b, live: true}
	s.writing = true
	for _, p := range c.Parts {
		if err := p.WriteTo(w); err != nil {
			return err
		}
	}
	s.writing = false
	m := &Metadata{ID: c.ID}
	if err := s.writeOffsetsAndPending(b, c, m); err != nil {
		return err
	}
	mb, _ := json.Marshal(m)
	_ = b.Set(metaKey(c.ID), mb, nil)
	_ = b.Set(keyLatest, binary.BigEndian.AppendUint64(nil, c.ID), nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	s.mu.Lock()
	s.mu.history = append([]Metadata{*m}, s.mu.history...)
	s.mu.Unlock()
	return b.Close()
}

// crashRun commits a random sequence on a crashable in-memory FS and takes a
// crash clone before EVERY filesystem operation (with a random share of the
// unsynced data kept). It then opens every clone and checks that its
// content is exactly one checkpoint: one completed when the clone was taken,
// or the one being committed — never a mix, never older. It returns the
// first violation.
func crashRun(t *testing.T, rng *rand.Rand, commit commitFunc) error {
	mem := vfs.NewCrashableMem()
	type clone struct {
		fs        *vfs.MemFS
		completed int // commits completed before the clone
	}
	var (
		mu        sync.Mutex
		clones    []clone
		completed atomic.Int64
		armed     atomic.Bool
	)
	crng := rand.New(rand.NewPCG(rng.Uint64(), 0))
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !armed.Load() || op.Kind.ReadOrWrite() != errorfs.OpIsWrite {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		pct := []int{0, 50, 100}[crng.IntN(3)]
		c := clone{completed: int(completed.Load())}
		c.fs = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(crng.Uint64(), 1))})
		clones = append(clones, c)
		return nil
	})
	// RotateMemTableAt: the big commits (every third) go into a fresh
	// memtable, so crashes also hit the rotation and the flushes it starts.
	s, err := Open("db", Options{FS: storefs.New(errorfs.Wrap(mem, inj)), MemTableSize: 256 << 10, RotateMemTableAt: 1000})
	if err != nil {
		return err
	}
	models := []content{emptyContent()}
	armed.Store(true)
	for i := 1; i <= 8; i++ {
		c := randomCommit(rng, uint64(i), models[i-1], i%3 == 0)
		if err := commit(s, c); err != nil {
			return err
		}
		m := models[i-1].clone()
		m.apply(c)
		models = append(models, m)
		completed.Add(1)
	}
	armed.Store(false)
	if err := s.Close(); err != nil {
		return err
	}
	t.Logf("%d crash points", len(clones))
	for i, c := range clones {
		r, err := Open("db", Options{FS: storefs.New(c.fs)})
		if err != nil {
			return errors.Join(errors.New("reopen after crash"), err)
		}
		got := readContent(t, r)
		r.Close()
		ok := false
		for j := c.completed; j <= c.completed+1 && j < len(models); j++ {
			ok = ok || sameContent(got, models[j])
		}
		if !ok {
			return &crashViolation{clone: i, completed: c.completed, diff: diffContent(got, models[c.completed])}
		}
	}
	return nil
}

type crashViolation struct {
	clone, completed int
	diff             string
}

func (v *crashViolation) Error() string {
	return "crash point " + itoa(v.clone) + " (after " + itoa(v.completed) + " completed commits) recovered a state that is no single checkpoint; vs the last completed: " + v.diff
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestCheckpointCrashAtomicity(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 7))
	if err := crashRun(t, rng, realCommit); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointCrashControls proves the crash check can fail: the broken
// commit paths must be caught.
func TestCheckpointCrashControls(t *testing.T) {
	for name, fn := range map[string]commitFunc{"two batches": splitCommit, "no sync": unsyncedCommit} {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed(t), 7))
			err := crashRun(t, rng, fn)
			var v *crashViolation
			if !errors.As(err, &v) {
				t.Fatalf("control not caught: %v", err)
			}
			t.Logf("caught as expected: %v", err)
		})
	}
}

// TestCheckpointWriteErrors fails the n-th write or sync of the log (errorfs)
// during a sequence of commits; after a crash the store holds exactly the
// last completed checkpoint or the failed one, and the failed Commit
// returned an error.
func TestCheckpointWriteErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 9))
	failures := 0
	for n := int32(0); n < 16; n++ {
		mem := vfs.NewCrashableMem()
		var armed atomic.Bool
		var count atomic.Int32
		inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
			// Only the log's writes and syncs: Pebble panics (fail-stop, with
			// its locks held) on other write errors, e.g. when rotating the
			// log; the commits here are too small to rotate it.
			if !armed.Load() || !strings.HasSuffix(op.Path, ".log") ||
				(op.Kind != errorfs.OpFileWrite && op.Kind != errorfs.OpFileSync && op.Kind != errorfs.OpFileSyncData) {
				return nil
			}
			if count.Add(1)-1 == n {
				return errorfs.ErrInjected
			}
			return nil
		})
		s, err := Open("db", Options{FS: storefs.New(errorfs.Wrap(mem, inj))})
		if err != nil {
			t.Fatal(err)
		}
		models := []content{emptyContent()}
		armed.Store(true)
		var failedAt int
		for i := 1; i <= 6; i++ {
			c := randomCommit(rng, uint64(i), models[i-1], false)
			m := models[i-1].clone()
			m.apply(c)
			models = append(models, m)
			if _, err := s.Commit(context.Background(), c); err != nil {
				if !errors.Is(err, errorfs.ErrInjected) && !errors.Is(err, ErrFailed) {
					t.Fatalf("n=%d: commit error %v", n, err)
				}
				failedAt = i
				break
			}
		}
		if failedAt > 0 {
			failures++
		}
		// Crash now (synced data only) and recover.
		clone := mem.CrashClone(vfs.CrashCloneCfg{})
		armed.Store(false)
		_ = s.Close() // may report the injected error again
		r, err := Open("db", Options{FS: storefs.New(clone)})
		if err != nil {
			t.Fatalf("n=%d: reopen: %v", n, err)
		}
		got := readContent(t, r)
		r.Close()
		last := len(models) - 1
		if failedAt > 0 {
			last = failedAt - 1
		}
		if !sameContent(got, models[last]) && !(failedAt > 0 && sameContent(got, models[failedAt])) {
			t.Fatalf("n=%d (commit %d failed): recovered %s", n, failedAt, diffContent(got, models[last]))
		}
	}
	if failures == 0 {
		t.Fatal("no injected failure hit a commit")
	}
}
