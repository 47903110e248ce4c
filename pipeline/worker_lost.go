package pipeline

import (
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/internal/scaleout"
)

// ErrTaskStateLost is returned by RunWorker (wrapped, naming the task and
// what is missing) when a task's state cannot be rebuilt: the commit
// records of its chain or the changelog segments its latest record lists
// are no longer on the broker (retention, a deleted job topic, a broker
// that lost messages), or this worker's directory holds checkpoints of a
// task the broker has no chain for. Starting such a task empty would read
// its input again from the start position and repeat (or, past the
// broker's retention, lose) output, so the worker stops instead, and so
// does every worker the task goes to next. See the error's text for how to
// recover.
var ErrTaskStateLost = errors.New("pipeline: a task's state cannot be rebuilt")

// lostAttempts is how many runs of a task in a row must find its state gone
// before the worker gives up: a pull served by a replica that lags behind
// can look like a missing segment once, a deletion looks so every time.
const lostAttempts = 3

// stateLostRecovery says what an operator can do about ErrTaskStateLost.
const stateLostRecovery = "the worker will not start it empty. To recover: bring the broker's data back " +
	"(restore its store, or fail over to a replica that has the records) and start the workers again; " +
	"or start the job afresh on purpose: stop every worker, delete the job's runnel_commit_*/runnel_changelog_* topics " +
	"and the workers' state directories (or run it under a new name), and choose where its sources start; " +
	"output already written may then be written again. Keep the broker's retention (fileReservedTime) " +
	"longer than the job is ever stopped"

// isStateLost reports whether err says a task's state is gone from the
// broker (or cannot be matched to it), rather than a transient failure.
func isStateLost(err error) bool {
	return errors.Is(err, scaleout.ErrChainTruncated) || errors.Is(err, scaleout.ErrSegmentGone) ||
		errors.Is(err, scaleout.ErrStaleLocalState)
}

// stateLostError wraps err, a state-lost failure of task, in
// ErrTaskStateLost with what to do about it.
func stateLostError(task string, err error) error {
	return fmt.Errorf("%w: task %s: %w; %s", ErrTaskStateLost, task, err, stateLostRecovery)
}

// giveUp records the worker's fatal error (the first one wins) and stops
// its run: RunWorker returns it after stopping its other tasks.
func (w *worker) giveUp(err error) {
	w.fatalOnce.Do(func() {
		w.fatalErr = err
		close(w.fatal)
	})
}
