package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestConnWaitsOneWindow: callers without a deadline asking, all at once
// and over and over, for a connection to an address that refuses every
// dial. Each call must end with ErrUnreachable after at most one backoff
// and one dial; before, a call that lost the race for every dial window
// (another caller dialed and failed, the call went back to waiting for
// the next window) could wait through several of them, and a sink's commit
// blocked in conn for over a minute behind heartbeats.
func TestConnWaitsOneWindow(t *testing.T) {
	addr := deadAddr(t)
	c, err := New(WithNameServers(deadAddr(t)), WithDialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const callers = 8
	run := 5 * time.Second
	if testing.Short() {
		run = 2500 * time.Millisecond
	}
	end := time.Now().Add(run)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		worst time.Duration
		calls int
	)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				cn, err := c.conn(context.Background(), addr)
				took := time.Since(start)
				if err == nil {
					t.Errorf("conn to %s (nothing listens) succeeded: %v", addr, cn)
					return
				}
				if !errors.Is(err, ErrUnreachable) {
					t.Errorf("conn error %v, want ErrUnreachable", err)
					return
				}
				mu.Lock()
				worst, calls = max(worst, took), calls+1
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls, the longest %v", calls, worst)
	// One backoff (at most maxDialBackoff) and a refused dial (well under
	// a second on loopback), with slack for a loaded machine.
	if limit := maxDialBackoff + 750*time.Millisecond; worst > limit {
		t.Fatalf("a conn call took %v, more than one dial window (%v)", worst, limit)
	}
}
