package checkpoint

import (
	"context"
	"sync"
	"time"
)

// Requested range compactions. Deleting expired state (package state's TTL
// sweep) writes tombstones; the space comes back only when a compaction
// drops them with the values they shadow, which Pebble's own heuristics may
// not schedule for a long time. CompactState asks for a manual compaction of
// one operator's key group, run by a goroutine of the store (one at a time,
// requests coalesced), which Close stops and joins.

type compactor struct {
	mu      sync.Mutex
	queue   []compactReq
	running bool
	closed  bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	done    int // compactions finished (tests)
}

type compactReq struct {
	uid string
	kg  uint16
}

// CompactState asks for a compaction of the committed state of
// (operatorUID, keyGroup), so that deleted entries leave the disk. It does
// not block; a request already queued is not queued again.
func (s *Store) CompactState(operatorUID string, keyGroup uint16) {
	c := &s.compactions
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || s.opts.readOnly {
		return
	}
	r := compactReq{uid: operatorUID, kg: keyGroup}
	for _, q := range c.queue {
		if q == r {
			return
		}
	}
	c.queue = append(c.queue, r)
	if c.running {
		return
	}
	if c.ctx == nil {
		c.ctx, c.cancel = context.WithCancel(context.Background())
	}
	c.running = true
	c.wg.Go(func() { s.runCompactions() })
}

func (s *Store) runCompactions() {
	c := &s.compactions
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || c.closed {
			c.running = false
			c.mu.Unlock()
			return
		}
		r := c.queue[0]
		c.queue = c.queue[1:]
		ctx := c.ctx
		c.mu.Unlock()
		lower := appendStatePrefix(nil, r.uid, r.kg)
		start := time.Now()
		err := s.db.Compact(ctx, lower, prefixEnd(lower), false)
		if err != nil && ctx.Err() == nil {
			// Not a correctness problem: the tombstones stay until
			// Pebble compacts the range on its own.
			s.log.Warn("checkpoint: compacting deleted state failed", "operator", r.uid, "keyGroup", r.kg, "err", err)
		} else if err == nil {
			s.log.Debug("checkpoint: compacted deleted state", "operator", r.uid, "keyGroup", r.kg, "took", time.Since(start))
		}
		c.mu.Lock()
		c.done++
		c.mu.Unlock()
	}
}

// CompactionsDone returns how many requested compactions finished.
func (s *Store) CompactionsDone() int {
	s.compactions.mu.Lock()
	defer s.compactions.mu.Unlock()
	return s.compactions.done
}

// stopCompactions cancels a compaction in progress and waits for it (Close).
func (s *Store) stopCompactions() {
	c := &s.compactions
	c.mu.Lock()
	c.closed = true
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// CompactionsPending reports whether requested compactions are queued or
// running.
func (s *Store) CompactionsPending() bool {
	s.compactions.mu.Lock()
	defer s.compactions.mu.Unlock()
	return s.compactions.running || len(s.compactions.queue) > 0
}
