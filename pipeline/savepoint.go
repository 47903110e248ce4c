package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
)

// savepointConfig holds the job's savepoint and restore options.
type savepointConfig struct {
	keep    int
	every   time.Duration
	restore string
}

// RetainCheckpoints keeps retained copies of the job's last n completed
// checkpoints in its checkpoint directory (under retained/), one taken at
// most every `every` (0: after every checkpoint), so that the job can be
// restored from any of them (RestoreFrom, `runnel checkpoint list`), not
// only from its latest. A copy is a Pebble checkpoint: hard links to the
// store's files plus a copy of its write-ahead log and manifest (bounded by
// the memtable, 64 MiB); the coordinator takes it right after the commit,
// delaying the next checkpoint by that long. Default 0: only the latest
// checkpoint (and savepoints) can be restored.
func RetainCheckpoints(n int, every time.Duration) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.sp.keep, c.sp.every = n, every })
}

// RestoreFrom restores the job, before it starts, from a retained
// checkpoint or savepoint of its checkpoint directory (spec is its id, as
// `runnel checkpoint list` shows it) or from a savepoint file (spec is its
// path). The checkpoint directory's offsets, state and pending sink
// transactions are replaced by the point's, under the next checkpoint id.
// The restore is applied once: the store records spec, and a job restarted
// with the same option (by a supervisor, after a crash) resumes from its
// latest checkpoint instead of going back again.
//
// Going back to a point older than the job's latest checkpoint processes
// the records since that point again. Idempotent sinks overwrite their
// output; transactional sinks would write it twice, so each sink that
// implements sink.RestoreChecker checks first and the job fails with
// sink.ErrOutputAhead when output past the point was committed (the
// exactly-once RocketMQ sink does: restore such a job into a new output
// topic, or from its latest checkpoint). A savepoint taken with stop and
// restored before anything else ran is never behind its output.
func RestoreFrom(spec string) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.sp.restore = spec })
}

// Savepoint takes a savepoint of the running job (as POST /savepoint on its
// status endpoint does): a checkpoint whose content is then written to a
// savepoint file in the checkpoint directory. With stop the job stops after
// it, once its sinks committed the savepoint's transactions (Run then
// returns nil). It fails with runtime.ErrNotRunning before Run started or
// after it ended.
func (j *Job) Savepoint(ctx context.Context, stop bool) (runtime.SavepointResult, error) {
	eng := j.engine.Load()
	if eng == nil {
		return runtime.SavepointResult{}, runtime.ErrNotRunning
	}
	return eng.Savepoint(ctx, stop)
}

// checkRestore runs a two-phase-commit sink's restore check when this run
// restored the job from a retained checkpoint or savepoint.
func checkRestore[T any](ctx context.Context, r *jobRun, uid string, tpc sink.TwoPhaseCommit[T], mine []checkpoint.PendingCommit) error {
	res, ok := r.engine.RestoredFrom()
	if !ok {
		return nil
	}
	rc, ok := tpc.(sink.RestoreChecker)
	if !ok {
		r.engine.Logger().Warn("sink cannot check for output committed after the restored checkpoint: records after it are written again if it was",
			"sink", uid, "checkpoint", res.From.ID, "replaced", res.Replaced.ID)
		return nil
	}
	p := sink.RestorePoint{CheckpointID: res.From.ID, Time: res.From.Metadata.Time}
	for _, pc := range mine {
		p.Pending = append(p.Pending, pc.Data)
	}
	if err := rc.CheckRestore(ctx, p); err != nil {
		return fmt.Errorf("restore from %s %d: %w", res.From.Kind, res.From.ID, err)
	}
	return nil
}
