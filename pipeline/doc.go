// Package pipeline is runnel's user API: typed, Flink-style stream jobs.
//
// # Streams
//
// A Job is built from a source (FromSource, FromBytes, FromSourceDecoded)
// and typed transformations — Map, Filter, FlatMap, Union — that are chained
// into the source's tasks (one task per source split), then KeyBy to shuffle
// records by key to parallel keyed subtasks running Process, Reduce or
// Aggregate with per-key state and timers, and finally To a sink. Every
// operator has a UID, unique in the job and stable across versions: it keys
// the operator's state and offsets in checkpoints.
//
//	job := pipeline.New("wordcount", pipeline.CheckpointDir(dir), pipeline.CheckpointInterval(time.Second))
//	lines := pipeline.FromSource(job, "lines", source.NewSlice(text, 2))
//	words := pipeline.FlatMap(lines, "split", splitWords)
//	counts := pipeline.Reduce(pipeline.KeyBy(words, wordOf), "count", add)
//	pipeline.To(counts, "print", sink.NewStdout[WordCount](nil, nil))
//	err := job.Run(ctx)
//
// # Identity
//
// Sources and sinks learn who they are from the job instead of from their
// users: when Run starts, before anything is restored or opened, every
// source (of FromSource, FromBytes, FromSourceDecoded) and sink (of To,
// and of DeadLetter policies) that implements jobinfo.Binder is bound once
// with the job's name (New), its operator's UID and the checkpoint
// directory (CheckpointDir; "" without one). From them they derive their
// consumer groups, producer and transaction groups and client instance
// names, keeping any the user gave explicitly (see source/rocketmq and
// sink/rocketmq). A Bind error fails Run. The job's name and the UIDs are
// therefore part of a job's identity on the broker, as the UIDs are in its
// checkpoints: keep them stable across versions.
//
// # Keyed state and timers
//
// A KeyedProcessFunc is instantiated once per keyed subtask (Process takes a
// constructor). Its Open registers state handles on the subtask's backend
// (state.NewValue(ctx.Backend(), …)); ProcessElement and OnTimer see the
// handles bound to the current key, and register event-time or
// processing-time timers through the KeyedContext. Side outputs go to
// OutputTags selected with SideOutput.
//
// A function that implements GroupTimerFunc may instead register one
// event-time timer for a whole key group (RegisterGroupEventTimer): its
// OnGroupTimer fires in timestamp order with the key timers (first on a
// tie) and acts on each of its keys through KeyedContext.ForKey, under the
// operator's retry and error policy per key. Event-time tumbling and
// sliding windows use it to keep one timer per key group and window end
// instead of one per key and window.
//
// # Two inputs
//
// ConnectKeyed connects two keyed streams with the same key type for a
// KeyedCoProcessFunc (KeyedCoProcess): records of both inputs with equal
// keys share the key's state and timers. Connect does the same without
// keys for a CoProcessFunc (CoProcess; records spread round robin, no
// state, no timers). IntervalJoin joins records of equal keys whose times
// are within an interval of each other; window.Join and window.CoGroup
// join per key and window (CoGroup sees windows with one side empty, for
// outer joins). Broadcast sends a low-volume stream to every subtask of a
// ProcessBroadcast or ProcessKeyedBroadcast operator, whose broadcast
// side writes broadcast state (NewBroadcastMap) that the other side only
// reads; it is checkpointed once and restored on every subtask, whatever
// the parallelism. A two-input operator's watermark is the minimum over
// the tasks of both inputs, and its barriers are aligned across both. A
// keyed two-input operator runs on many workers (RunWorker); a broadcast
// operator does not (ErrBroadcastScaleout).
//
// # Event time and watermarks
//
// Every record has an event time: the source record's own (for broker
// messages their born or store time), or the one Stream.WithTimestamps
// assigns from the decoded record. Each source split generates its own
// watermark from the event times it sees (BoundedOutOfOrderness,
// CustomWatermarks): a promise that no record at or
// before it will follow from that split. A keyed subtask's watermark is
// the minimum over its inputs, and fires its event-time timers (and
// windows, see package window). So a split that never receives a record —
// a topic with 8 queues and events in 3 of them — holds every watermark
// downstream back, and no event-time window fires, until IdleTimeout
// marks the quiet split idle (idle splits are left out of the minimum) or
// the input ends. The status page and GET /status show each operator's
// watermark and the splits holding it back, idle or not.
//
// With several splits, which records are late depends on how far the
// splits' reading runs apart: a job restored from a checkpoint resumes
// with the watermarks it had checkpointed, but the interleaving of splits
// after the restore may differ from an uninterrupted run's. Results equal
// an uninterrupted run's when no record arrives behind the watermark, or
// when the input is a single split. A record behind the watermark, after everything it
// belonged to expired (a window operator's record whose windows all fired
// and were cleaned up, a missing timestamp field decoded as 1970), is late:
// it is counted in the operator's late records, and goes to a side output
// or dead letters (see KeyedContext.LateRecord); it never vanishes
// uncounted.
//
// # Bad records
//
// Records that fail to decode or validate (go-playground/validator struct
// tags) at the source edge, and records on which a user function fails after
// its retries (panics are recovered into errors), are handled by a Policy:
// DeadLetter to a sink of sink.DeadLetter records (with the error, source
// split and offset), Skip (counted), or Fail the job (the default for
// operators). A dead letter's Reason starts with the reason class —
// ReasonDecode, ReasonValidate, ReasonProcess, ReasonPanic or ReasonLate —
// then ": " and the error (for instance "decode: cannot decode JSON into
// main.Click: invalid character …"); the status page and
// runtime.HookDeadLetter show the same classes.
//
// # Parallel stages, async I/O and operator state
//
// Rebalance deals a stream over Parallelism subtasks (default
// DefaultParallelism) that run the operators chained after it, so that
// stateless work after a source with fewer splits than cores uses every
// core. OrderedWait and UnorderedWait (and their Future forms) call a
// service per record without blocking the stream: up to AsyncCapacity
// requests in flight per subtask, AsyncTimeout and Retry per attempt,
// results in input order or as they complete (never across a
// watermark); the requests in flight at a checkpoint are stored in it
// and issued again after a restore. ProcessStream runs a non-keyed
// ProcessFunc whose operator state (NewListState, NewUnionListState) is
// redistributed when the parallelism changes; sinks keep operator state
// by implementing OperatorStateful. These operators run in one process:
// RunWorker refuses a job that has one (ErrSingleProcessOnly).
//
// # Exactly-once
//
// Job.Run checkpoints periodically with aligned barriers: source offsets,
// keyed state changes and sink pre-commits go into one atomic checkpoint
// commit, and a restarted job resumes from the latest one. See package
// runtime for the protocol and package sink for the sink contracts.
//
// Inside a job, a task is one of two kinds. A task that starts the stream
// (a source split's) polls its reader and takes each checkpoint between
// two polls, when the coordinator triggers it. A task fed by other tasks
// (a keyed subtask, a parallel stage's subtask, a sink) reads one queue per
// sender: it blocks a sender whose barrier arrived until every live
// sender's did (senders that ended count as aligned), then takes the
// checkpoint; its watermark is the minimum over its senders that are
// neither idle nor ended. Both kinds take a checkpoint the same way —
// output flushed (and, across workers, acknowledged by the broker), the
// task's snapshot acknowledged, then the barrier sent on — so that what a
// checkpoint holds is exactly what went before its barrier. A keyed
// record's key is encoded once, by the sending task, which needs the
// bytes for the key group; they travel with the record to the keyed
// subtask's state.
package pipeline
