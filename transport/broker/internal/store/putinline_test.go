package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

// TestPutAsyncInline checks where PutAsyncInline commits: on the caller's
// goroutine (done called before it returns, one round per call) in
// FlushAsync mode with an idle committer; through the committer in
// FlushSync mode (done after the fsync: Syncs counts it); and behind
// calls already queued, so that one goroutine's calls keep their order in
// a queue.
func TestPutAsyncInline(t *testing.T) {
	ctx := context.Background()
	t.Run("async/idle", func(t *testing.T) {
		s := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync})
		for i := range 20 {
			var called atomic.Int32
			res := make([]PutResult, 1)
			m := []PutMessage{msg("A", 0, fmt.Sprintf("a%d", i), fmt.Sprintf("k%d", i))}
			rounds := s.Rounds()
			err := s.PutAsyncInline(ctx, m, res, func(err error) {
				if err != nil {
					t.Errorf("done %d: %v", i, err)
				}
				called.Add(1)
			})
			if err != nil {
				t.Fatalf("PutAsyncInline %d: %v", i, err)
			}
			if called.Load() != 1 {
				t.Fatalf("put %d: done not called before PutAsyncInline returned", i)
			}
			if got := s.Rounds() - rounds; got != 1 {
				t.Fatalf("put %d: %d rounds", i, got)
			}
			if res[0].QueueOffset != int64(i) || recQueueOffset(m[0].Record) != int64(i) {
				t.Fatalf("put %d: offset %d, record %d", i, res[0].QueueOffset, recQueueOffset(m[0].Record))
			}
			if max, _ := s.MaxOffset("A", 0); max != int64(i+1) {
				t.Fatalf("put %d: max offset %d before done returned", i, max)
			}
		}
		if got := len(getAll(t, s, "A", 0, 0)); got != 20 {
			t.Fatalf("%d records, want 20", got)
		}
		if err := s.PutAsyncInline(ctx, []PutMessage{msg("A", 0, "x")}, nil, func(error) { t.Error("callback of a refused call") }); !errors.Is(err, ErrInvalid) {
			t.Fatalf("PutAsyncInline without result slots: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.PutAsyncInline(ctx, []PutMessage{msg("A", 0, "x")}, make([]PutResult, 1), func(error) { t.Error("callback after Close") }); !errors.Is(err, ErrClosed) {
			t.Fatalf("PutAsyncInline after Close: %v", err)
		}
	})
	t.Run("sync/committer", func(t *testing.T) {
		s := openTest(t, t.TempDir(), Options{FlushMode: FlushSync})
		defer s.Close()
		syncs := s.Syncs()
		done := make(chan error, 1)
		if err := s.PutAsyncInline(ctx, []PutMessage{msg("A", 0, "a")}, make([]PutResult, 1), func(err error) {
			if s.Syncs() == syncs {
				err = errors.New("answered before the fsync")
			}
			done <- err
		}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("async/behind-queued", func(t *testing.T) {
		s := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync})
		defer s.Close()
		for i := range 50 {
			// Hold the append lock so that the committer takes the first
			// call and waits with it; the second call comes as the lock
			// is released, racing the committer for it.
			s.writeMu.Lock()
			first, second := make([]PutResult, 1), make([]PutResult, 1)
			errs := make(chan error, 2)
			if err := s.PutAsync(ctx, []PutMessage{msg("Q", 0, "first")}, first, func(err error) { errs <- err }); err != nil {
				s.writeMu.Unlock()
				t.Fatal(err)
			}
			for len(s.reqs) > 0 {
				// the committer has not taken it yet
			}
			s.writeMu.Unlock()
			if err := s.PutAsyncInline(ctx, []PutMessage{msg("Q", 0, "second")}, second, func(err error) { errs <- err }); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if first[0].QueueOffset != int64(2*i) || second[0].QueueOffset != int64(2*i+1) {
				t.Fatalf("round %d: first at %d, second at %d", i, first[0].QueueOffset, second[0].QueueOffset)
			}
		}
	})
}
