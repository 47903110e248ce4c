// Package jobinfo is how a job tells its sources and sinks who they are, so
// that users do not retype what the job already knows: the job's name, the
// operator's UID and the job's state directory. From them a source or sink
// derives its consumer and producer groups, its client instance name and
// its transaction group, keeping any explicit override the user gave.
//
// The pipeline calls Bind on every source and sink that implements Binder
// once, when the job runs, before anything is restored or opened. It is a
// leaf package (standard library only) so that sources, sinks and the
// pipeline can all import it.
package jobinfo

// Info describes a source's or sink's place in a job.
type Info struct {
	// Job is the job's name (pipeline.New's name). Every worker process of
	// one job has the same Job.
	Job string
	// UID is the UID of the operator the source or sink belongs to (for a
	// dead-letter sink, the UID its policy was given).
	UID string
	// StateDir is the job's checkpoint directory ("" for a job without
	// checkpoints). It is per worker process: it names this process's
	// state, not the job's.
	StateDir string
}

// Binder is implemented by sources and sinks that take their identity from
// the job. Bind is called once, before Open, Recover or the first Write; it
// must not block or do I/O, and an error fails the job's Run with it.
type Binder interface {
	Bind(info Info) error
}
