package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestCrashCloneDurability checks what a kill -9 test cannot: that SYNC
// Puts are on stable storage when they return. The store runs on Pebble's
// crashable in-memory FS; while putters run, the test snapshots the set of
// acknowledged Puts and then clones the FS as a machine crash would leave it
// (all synced data, a random share of unsynced data). Every acknowledged
// message must be in the clone, with dense offsets. The async control run
// shows the check fails when Put does not wait for fsync.
func TestCrashCloneDurability(t *testing.T) {
	t.Run("sync", func(t *testing.T) {
		if lost := crashCloneRun(t, FlushSync, 8); lost != 0 {
			t.Fatalf("%d acknowledged SYNC messages lost in crash clones", lost)
		}
	})
	t.Run("async-control", func(t *testing.T) {
		if lost := crashCloneRun(t, FlushAsync, 3); lost == 0 {
			t.Fatal("control: ASYNC mode with no background sync lost nothing; the check has no teeth")
		}
	})
}

// crashCloneRun returns how many acknowledged messages were missing from
// crash clones.
func crashCloneRun(t *testing.T, mode FlushMode, clones int) int {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	fs := vfs.NewCrashableMem()
	s, err := Open("/db", Options{FlushMode: mode, SyncInterval: time.Hour,
		PebbleOptions: &pebble.Options{FS: fs}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked := make(map[ackKey]uint64)
	stop := make(chan struct{})
	var gate sync.RWMutex // write-locked to pause putters while a clone is verified
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Appendf(nil, "w%d-%d", w, i)
				m := msg("cc", int32(w%2), string(body))
				gate.RLock()
				res, err := s.Put(context.Background(), []PutMessage{m})
				gate.RUnlock()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[ackKey{"cc", m.QueueID, res[0].QueueOffset}] = bodyHash(body)
				mu.Unlock()
			}
		})
	}
	lost, done := 0, 0
	for range clones {
		// Let some Puts complete, then snapshot acks, then crash-clone.
		target := done + 20 + rng.IntN(200)
		checkFor(t, 10*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(acked) < target {
				return fmt.Errorf("%d acks", len(acked))
			}
			return nil
		})
		mu.Lock()
		snap := make(map[ackKey]uint64, len(acked))
		for k, v := range acked {
			snap[k] = v
		}
		mu.Unlock()
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(100), RNG: rand.New(rand.NewPCG(rng.Uint64(), 2))})
		gate.Lock()
		lost += verifyClone(t, clone, snap)
		mu.Lock()
		done = len(acked)
		mu.Unlock()
		gate.Unlock()
	}
	close(stop)
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return lost
}

func verifyClone(t *testing.T, fs vfs.FS, acked map[ackKey]uint64) int {
	t.Helper()
	s, err := Open("/db", Options{PebbleOptions: &pebble.Options{FS: fs}})
	if err != nil {
		t.Fatalf("open crash clone: %v", err)
	}
	defer s.Close()
	lost := 0
	for k, h := range acked {
		found := false
		if _, err := s.Get(k.topic, k.queue, k.off, 1, 0, func(rec []byte, _ int64) bool {
			found = recQueueOffset(rec) == k.off && bodyHash(recordBody(rec)) == h
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if !found {
			lost++
		}
	}
	for q := range int32(2) {
		maxOff, _ := s.MaxOffset("cc", q)
		recs := getAll(t, s, "cc", q, 0)
		if int64(len(recs)) != maxOff {
			t.Fatalf("clone queue %d: %d records, max %d", q, len(recs), maxOff)
		}
		for i, r := range recs {
			if recQueueOffset(r) != int64(i) {
				t.Fatalf("clone queue %d: offsets not dense at %d", q, i)
			}
		}
	}
	return lost
}
