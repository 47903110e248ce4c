package rocketmq

import "sync/atomic"

// lagState is a reader's view of its queue's lag: the broker's max offset
// (from the fetcher's last pull answer) minus the offset of the last
// completed checkpoint.
type lagState struct {
	maxOffset atomic.Int64 // written by the fetch goroutine; -1 = no pull answered yet
	committed int64        // task goroutine only: offset of the last completed checkpoint
}

func (r *reader) initLag(start int64) {
	r.maxOffset.Store(-1)
	r.committed = start
}

// checkpointed notes that the offset last given to the runtime (Offset) is
// now part of a completed checkpoint.
func (r *reader) checkpointed() {
	if r.snap >= 0 {
		r.committed = r.snap
	}
}

// Lag implements source.LagReporter: the broker's max offset of the queue
// minus the split's offset in the last completed checkpoint (its start
// offset before the first one); unknown until a pull was answered. It runs
// on the split's task goroutine.
func (r *reader) Lag() (int64, bool) {
	m := r.maxOffset.Load()
	if m < 0 {
		return 0, false
	}
	if r.end >= 0 {
		m = min(m, r.end)
	}
	return max(m-r.committed, 0), true
}
