package state

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

// sstBytes is the size of a store's SSTs (its state on disk once flushed).
func sstBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".sst") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// runTTLSweep writes 40k keys of 256 bytes once into a TTL state of a
// subtask on real Pebble (1 MiB memtable, so they reach SSTs), never reads
// them, lets them expire, and then only checkpoints (Snapshot, Commit,
// Committed) with other keys being written, as a job does. It returns the
// SST bytes after the writes and after each checkpoint past the expiry.
func runTTLSweep(t *testing.T, sweep int) (before int64, after []int64) {
	const keys, checkpoints = 40_000, 14
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	var now atomic.Int64
	now.Store(time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	b, err := NewBackend(s, "op", 16, WithTTLSweep(sweep))
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := NewValue(b, "seen", BytesCodec(), WithTTL(time.Hour, clock))
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewValue(b, "other", Int64Codec())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := uint64(0)
	checkpointOnce := func() {
		id++
		p := b.Snapshot(id)
		if _, err := s.Commit(ctx, &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{p}}); err != nil {
			t.Fatal(err)
		}
		b.Committed(id)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, 256)
	for i := range keys {
		for j := range val { // incompressible, so the SSTs hold ~10 MiB
			val[j] = byte(rng.Uint32())
		}
		b.SetCurrentKey(fmt.Appendf(nil, "key-%06d", i))
		if err := ttl.Set(val); err != nil {
			t.Fatal(err)
		}
		if i%10_000 == 9_999 {
			checkpointOnce()
		}
	}
	checkpointOnce()
	before = sstBytes(t, dir)
	now.Add(int64(2 * time.Hour)) // every "seen" entry has expired
	for c := range checkpoints {
		for i := range 50 { // the job goes on with other state
			b.SetCurrentKey(fmt.Appendf(nil, "other-%d", i))
			if err := other.Set(int64(c)); err != nil {
				t.Fatal(err)
			}
		}
		checkpointOnce()
		// The compaction runs on a goroutine of the store: wait for the
		// ones requested so far (bounded: a hang fails the test).
		waitCompactions(t, s)
		after = append(after, sstBytes(t, dir))
	}
	if _, err := b.SweptTTL(); err != nil {
		t.Fatal(err)
	}
	return before, after
}

// waitCompactions waits until the store's compaction queue is empty.
func waitCompactions(t *testing.T, s *checkpoint.Store) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := s.CompactionsDone()
		time.Sleep(20 * time.Millisecond)
		if s.CompactionsDone() == n && !s.CompactionsPending() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("compactions did not finish in 60 s")
		}
	}
}

// TestStateTTLSweepShrinksDisk: 40k entries (about 10 MiB) written once and
// never read shrink below a tenth of their size on disk within the
// documented bound of checkpoints after they expired: ceil(N/B)+1 sweeps of
// B=4096 (11), plus the compaction. Its control, the sweep disabled, keeps
// them on disk: the check can fail.
func TestStateTTLSweepShrinksDisk(t *testing.T) {
	before, after := runTTLSweep(t, 4096)
	bound := before / 10
	limit := (40_000+4095)/4096 + 1
	t.Logf("SST bytes: %d after the writes; per checkpoint after expiry: %v", before, after)
	if before < 5<<20 {
		t.Fatalf("only %d bytes of SSTs after the writes: the test does not measure disk", before)
	}
	for i, n := range after {
		if n < bound {
			if i+1 > limit {
				t.Fatalf("state shrank below %d bytes only after %d checkpoints, bound %d", bound, i+1, limit)
			}
			return
		}
	}
	t.Fatalf("state on disk never shrank below %d bytes (a tenth): %v", bound, after)
}

func TestStateTTLSweepControl(t *testing.T) {
	before, after := runTTLSweep(t, -1)
	if last := after[len(after)-1]; last < before/10 {
		t.Fatalf("without the sweep the state shrank to %d bytes: the check cannot fail", last)
	}
}
