package store

import (
	"fmt"
	"sync/atomic"
	"time"
)

// msgDiskOverhead estimates the bytes a message adds to the disk besides
// its record: its key, value header, physical index entry and its share of
// the queue meta and WAL framing.
const msgDiskOverhead = 160

// diskGuard refuses writes while the store's file system is used above the
// high-water mark. admit is called on every Put (two atomic operations);
// the store's disk check goroutine refreshes the reading.
type diskGuard struct {
	on       bool // immutable after init
	mark     float64
	interval time.Duration
	usage    func() (avail, total uint64, err error)

	// limit is the used-bytes level (mark × total) of the last reading and
	// used the used bytes read then; pending counts the bytes admitted
	// since, so that a burst between two readings is accounted for.
	limit   atomic.Int64
	used    atomic.Int64
	pending atomic.Int64
	full    atomic.Bool
	// refused counts the Put calls refused for disk usage.
	refused atomic.Int64
}

func (g *diskGuard) init(dir string, o *Options) error {
	if o.DiskHighWatermark <= 0 || o.DiskHighWatermark >= 1 {
		return nil
	}
	g.on, g.mark, g.interval, g.usage = true, o.DiskHighWatermark, o.DiskCheckInterval, o.DiskUsage
	if g.usage == nil {
		g.usage = func() (uint64, uint64, error) { return statfs(dir) }
	}
	if _, err := g.check(); err != nil {
		return fmt.Errorf("store: disk usage of %s: %w", dir, err)
	}
	return nil
}

// check reads the disk usage and reports whether it is above the mark.
func (g *diskGuard) check() (bool, error) {
	before := g.pending.Load()
	avail, total, err := g.usage()
	if err != nil {
		return g.full.Load(), err
	}
	avail = min(avail, total)
	used := int64(min(total-avail, 1<<62))
	g.used.Store(used)
	g.limit.Store(int64(min(float64(total)*g.mark, 1<<62)))
	g.pending.Add(-before)
	full := used >= g.limit.Load()
	g.full.Store(full)
	return full, nil
}

// admit accounts a Put of size record bytes in n messages, or refuses it
// with ErrDiskFull.
func (g *diskGuard) admit(size, n int) error {
	if !g.on {
		return nil
	}
	if !g.full.Load() {
		add := int64(size) + int64(n)*msgDiskOverhead
		p := g.pending.Add(add)
		if g.used.Load()+p <= g.limit.Load() {
			return nil
		}
		g.pending.Add(-add)
		g.full.Store(true)
	}
	g.refused.Add(1)
	return fmt.Errorf("%w: about %s used, the mark is %.1f%% (%s)", ErrDiskFull,
		fmtBytes(g.used.Load()+g.pending.Load()), g.mark*100, fmtBytes(g.limit.Load()))
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

// runDiskCheck refreshes the disk usage every DiskCheckInterval, logging
// each crossing of the high-water mark once.
func (s *Store) runDiskCheck() {
	defer s.wg.Done()
	t := time.NewTicker(s.disk.interval)
	defer t.Stop()
	wasFull := s.disk.full.Load()
	failing := false
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		full, err := s.disk.check()
		if err != nil {
			if !failing {
				s.log.Error("store: cannot read disk usage; keeping the last reading", "err", err)
			}
			failing = true
			continue
		}
		failing = false
		if full != wasFull {
			if full {
				s.log.Error("store: disk usage above the high-water mark; refusing message writes",
					"used", s.disk.used.Load(), "mark", s.disk.mark)
			} else {
				s.log.Info("store: disk usage below the high-water mark again; accepting message writes",
					"used", s.disk.used.Load(), "mark", s.disk.mark)
			}
			wasFull = full
		}
	}
}

// DiskFull reports whether message writes are being refused for disk
// usage (ErrDiskFull), and DiskRefused how many Put calls were. Safe for
// concurrent use.
func (s *Store) DiskFull() bool { return s.disk.on && s.disk.full.Load() }

// DiskRefused returns how many Put and PutAsync calls were refused with
// ErrDiskFull. Safe for concurrent use.
func (s *Store) DiskRefused() int64 { return s.disk.refused.Load() }

// Failed returns the sticky write failure (wrapping ErrFailed), or nil.
// Safe for concurrent use.
func (s *Store) Failed() error { return s.failedErr() }
