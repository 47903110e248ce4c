// Package runtime is runnel's execution engine: the checkpoint coordinator,
// the task lifecycle, restore and the status endpoint of one job process.
//
// Package pipeline builds typed tasks (source-split tasks, keyed subtasks,
// sink tasks) from a user's graph and registers them on an Engine; the
// Engine runs them, triggers checkpoints, collects each task's
// acknowledgement (split offsets, a keyed backend's checkpoint.Part, sink
// pre-commits), commits them as ONE checkpoint.Store batch and then tells
// every task the outcome. Records never pass through this package: they
// flow between tasks on pipeline's typed, bounded channels, so the engine is
// free of interface{} payloads on the hot path.
//
// # Checkpoint protocol (what a task must do)
//
// Trigger(n) is delivered to every task through its Handle (Wake, then
// Trigger). A source task injects barrier n into its outputs at a record
// boundary and acknowledges with its split offset. Other tasks ignore the
// trigger while running: they acknowledge n when barrier n has arrived on
// all their inputs (alignment). A task that has finished (its inputs ended,
// or it passed a stop barrier) acknowledges pending triggers directly with
// a snapshot of its (quiescent) state. Every task acknowledges every
// checkpoint exactly once. When all acknowledgements are in, the engine
// commits and sends Completed(n) (or Aborted(n) on failure or timeout) to
// every task as a Note.
//
// # Ending
//
// When every task has called Finish (a bounded job drained), the engine takes
// a final checkpoint and closes. When the Run context is cancelled, it takes
// a stop checkpoint (Trigger reports stop=true: sources inject the barrier
// and stop reading, the other tasks stop after aligning it), commits it and
// closes. A task error is fatal: the engine cancels every task and returns
// the error without a final checkpoint.
//
// # Who sees what
//
// The Engine's exported methods serve the task-graph builder: package
// pipeline creates the Engine, adds its tasks (AddTask, OnDiscover), gives
// them their gauges (Operator, Split, Backpressure), their restored state
// (RestoredOffset, Store, RestoredFrom) and the status page its graph
// (SetGraph, DescribeOffsets, RecordDeadLetter). They stay exported rather
// than moving to an internal package: Go has no friend packages, the
// builder lives in another package, and the engine is this package's
// substance (a types-only runtime package beside an internal engine would
// split one concept in two). A user of pipeline never holds an *Engine.
// Observers get less: hooks receive a JobView (name, status, split gauges,
// backpressure), and people and scripts the status endpoint.
package runtime
