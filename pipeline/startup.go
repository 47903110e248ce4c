package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/source"
)

// DefaultStartupTimeout is how long Run waits by default for a source's
// system to become reachable when the job starts (see StartupTimeout).
const DefaultStartupTimeout = 30 * time.Second

// startupBackoff spaces the retries of a source that cannot be reached at
// start.
var startupBackoff = backoff.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// StartupTimeout bounds how long Run waits for each source at start: while
// listing its splits fails with an error wrapping source.ErrUnavailable (a
// RocketMQ source's name servers do not answer yet), Run retries with
// backoff (100 ms, doubling up to 5 s), logging at Warn what it waits for
// and how much of the budget is left, then fails with the last error once
// d has passed. Other errors (a missing topic, bad credentials) fail at
// once. 0 disables the retries; the default is DefaultStartupTimeout.
func StartupTimeout(d time.Duration) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.startup = &d })
}

// countTasks is n.taskCount, retried within the start-up budget while the
// source is unavailable.
func (r *jobRun) countTasks(ctx context.Context, n *node) (int, error) {
	budget := DefaultStartupTimeout
	if p := r.job.cfg.startup; p != nil {
		budget = *p
	}
	deadline := time.Now().Add(budget)
	for attempt := 0; ; attempt++ {
		cnt, err := n.taskCount(ctx, r)
		if err == nil || !errors.Is(err, source.ErrUnavailable) || ctx.Err() != nil {
			return cnt, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return cnt, err
		}
		d := min(startupBackoff.Delay(attempt), left)
		r.job.cfg.logger.Warn("pipeline: waiting for a source to become reachable", "job", r.job.name, "source", n.uid,
			"retry_in", d.Round(time.Millisecond), "startup_budget_left", left.Round(time.Millisecond), "err", err)
		if err := backoff.Sleep(ctx, d); err != nil {
			return 0, err
		}
	}
}
