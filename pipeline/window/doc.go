// Package window groups the records of a keyed stream into windows and
// computes one result per key and window: tumbling, sliding and session
// windows in event time or processing time, and global windows with a
// custom trigger. The semantics are Flink's (WindowOperator with its default
// triggers); the differences are listed below.
//
//	counts := window.Apply(pipeline.KeyBy(clicks, Click.UserID), "clicks-per-minute",
//		window.Tumbling(time.Minute), window.Count[Click](),
//		window.AllowedLateness(time.Minute), window.LateRecords(lateTag))
//	pipeline.To(counts, "out", sink)                              // Result[string, int64]
//	pipeline.To(pipeline.SideOutput(counts, lateTag), "late", lateSink)
//
// # Windows and assigners
//
// A window is the half-open interval [Start, End); its maximum timestamp is
// End - 1 ns. Tumbling(size) windows start at multiples of size since the
// Unix epoch (shifted by WithOffset); Sliding(size, slide) assigns a record
// to the size/slide windows that contain it; Session(gap) gives each record
// the window [t, t+gap) and merges windows of a key that overlap or touch,
// so a session ends after gap without records. Global(trigger) puts all
// records of a key in one window that only the trigger fires.
//
// Event-time assigners use the record's event time (the source's timestamp
// assignment, see pipeline.Stream.WithTimestamps) and fire on the watermark;
// ProcessingTime() variants use the job's clock when the record arrives and
// fire on it.
//
// # Firing, lateness and late records
//
// An event-time window fires once the watermark reaches its maximum
// timestamp, emitting a Result (Key, Start, End, Value, Firing) with the
// event time End - 1 ns. With AllowedLateness(d) its state is kept until the
// watermark passes End - 1 ns + d: a record arriving in that time is added
// and the window fires again at once with the updated value (Firing counts
// the firings of the window's contents: 0 for the first, n for the n-th
// update; consumers keep the highest). A record whose every window is past
// its lateness is late: it is counted in the operator's late records (the
// status page's Late column) and sent to the LateRecords side output, or
// else to the operator's dead-letter policy, or else dropped (the first
// drop per subtask is logged). Window
// state is deleted when the window expires (a timer at End - 1 ns + d; at End
// - 1 ns for processing-time windows, which are never late). When a bounded
// input ends, the final watermark fires every pending event-time window;
// processing-time windows still open then do not fire.
//
// # Window functions
//
// Apply computes the result incrementally: ReduceFn, AggregateFn and Count
// keep one accumulator per key and window. Process keeps the window's full
// contents and calls a ProcessFunc with them when the window fires. Session
// windows merge accumulators: AggregateFn's aggregator must then implement
// Merger (ReduceFn merges with its reduce function).
//
// # State
//
// Everything lives in the operator's keyed state (Pebble-backed, written
// only through checkpoints), namespaced by key and window: accumulators in
// a state.Map from window to accumulator, full contents in a state.Map from
// (window, sequence number) to record (so that adding a record writes one
// entry, where a per-key state.List would rewrite the list), session windows
// in a state.Map from window to the window that holds its state, and trigger
// state in a state.Map from window to bytes. Event-time tumbling and sliding
// windows with the default trigger have one timer per key group and time
// (pipeline.KeyedContext.RegisterGroupEventTimer) rather than one per key
// and window: the operator keeps in memory which keys have a window ending
// at each time, and rebuilds that index from the window state when it
// starts. Other windows (processing time, sessions, custom triggers) have
// the operator's per-key event and processing-time timers. All timers are
// restored with the checkpoint.
// Exactly-once: a job restored from a checkpoint has the window state,
// timers and watermarks of that checkpoint, so it emits the same results as
// a run without failure (when the input order is deterministic, see
// "Event time and watermarks" in package pipeline's documentation on
// multiple splits). An event-time window fires only when the watermark of
// every split upstream passes its end: a split that receives no records
// holds it back until pipeline.IdleTimeout marks it idle.
//
// # Differences from Flink
//
// Timers are per key, not per key and window: a custom trigger's
// OnEventTime and OnProcessingTime are called for every window of the key
// when any of the key's timers fires, and must ignore times that are not
// theirs (the built-in triggers do); timers cannot be deleted by triggers.
// Custom triggers are not supported on merging (session) assigners.
// Evictors, and the combination of an incremental function with a process
// function, are not provided; Process's ProcessFunc receives the key and
// window in its Pane, and Result carries them for incremental functions.
//
// Concurrency: the operator runs inside pipeline.Process: one instance per
// keyed subtask, called from that subtask's goroutine only. Window
// functions, triggers and codecs need no locking unless they share data.
package window
