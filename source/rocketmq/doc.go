// Package rocketmq is runnel's RocketMQ source: a pull-mode, checkpointable
// source.Source over one topic, read with runnel's client (package
// transport/client) from a RocketMQ cluster or runnel's embedded broker.
//
//	src, err := rocketmq.New(c, "lines", rocketmq.WithStart(rocketmq.Earliest()),
//		rocketmq.WithStop(rocketmq.StopAtLatest()))
//	msgs := pipeline.FromSource(job, "lines", src)             // Stream[rocketmq.Message]
//	raw := pipeline.FromBytes(job, "events", src.Bytes(), codec) // bodies decoded with a codec
//
// # Identity
//
// A Source takes its identity from the pipeline job it is added to
// (jobinfo.Binder; the job calls Bind before it uses the source): its
// consumer group is the job's name (GroupName) unless WithGroup names
// another, so that every source of a job, and every run of it, reports
// offsets and takes queue locks under one group, and two jobs never share
// one by accident. (A source used outside a job keeps the group
// "runnel_" + topic, the default before sources were bound; a job that
// relied on it and wants to keep its group passes WithGroup.) A source
// made by Dial instead of New owns its Client and names it after the job
// and its checkpoint directory (InstanceName), for queue locks (below).
//
// # Splits and offsets
//
// Every readable message queue of the topic is one split, with the stable ID
// "brokerName/queueId". The job owns the offsets: a split's offset (what
// SplitReader.Offset returns and the checkpoint stores) is the queue offset
// after the last record Poll returned, plus the split's stop offset (see
// Offset). The source never commits offsets to the broker on its own; after
// each completed checkpoint it reports the checkpointed offset with
// CommitOffset under its group (WithGroup), for lag tools only, and reading
// never starts from that report unless the start position asks for it
// (GroupOffset).
//
// # Start and stop positions
//
// When a split has no checkpointed offset it starts at the configured
// StartPosition: Earliest (default), Latest, AtTimestamp, GroupOffset (the
// broker's committed offset of the group, else a fallback) or Offsets
// (explicit per-split offsets, else a fallback). A StopPosition makes the source
// bounded: StopAtOffsets, StopAtLatest (the queue's max offset when the split
// is first opened; it is kept in the checkpointed offset, so a restarted job
// stops at the same place) or StopAtTimestamp. A bounded split returns
// source.ErrEndOfSplit from Poll once done, and the job finishes when all its
// sources have.
//
// # Reading
//
// Each open split has one fetch goroutine that pulls ahead with long polling
// (WithPollTimeout, 500 ms by default) into a buffer bounded per split by
// WithFlowControl (1000 messages / 100 MiB by default, RocketMQ's ProcessQueue
// thresholds); Poll only takes from that buffer, so it returns as soon as
// records are there or its ctx is cancelled (a barrier), and it never loses
// records: the offset moves only with the records it returns. A TAG expression
// (WithTagFilter) is applied by the broker and again by the client; records
// skipped by the filter advance the offset without being returned.
//
// A pull at an offset the queue no longer holds (OFFSET_MOVED, after retention
// or a truncated queue) resets the split to the earliest offset still
// available (the broker's min offset) and logs a warning with the number of
// offsets skipped; records that were deleted are lost, as they are for every
// RocketMQ consumer. Pull errors are retried with backoff; WithPullRetries
// consecutive failures make Poll fail, so the job fails and can be restarted
// from its last checkpoint.
//
// # Records
//
// The source is a source.Source[Message]: Message carries the body and the
// message's topic, queue, offset, keys, tags, properties and timestamps. Its
// event time is the born timestamp (the producer's clock) unless
// WithStoreTime selects the broker's store timestamp. Record.Raw is the body,
// so dead letters of decoding failures (pipeline.FromSourceDecoded,
// pipeline.FromBytes over Bytes) keep the original bytes. Message bodies and
// properties share the pull response they came in: treat them as read-only,
// and Clone a message to keep it long without pinning the whole response.
//
// # Discovery
//
// Source implements source.Discoverer: DiscoverSplits lists the topic's
// current queues, and a split that was not listed by Splits and has no
// checkpoint starts at its min offset. A running pipeline job calls it every
// pipeline.DiscoveryInterval (30 s by default) and on Job.DiscoverNow, so
// queues added to the topic while the job runs get their own split task, and
// their offsets are in the following checkpoints.
//
// # Queue locks
//
// With WithQueueLocking one process owns the job's queues: Splits (and Open)
// take the broker lock (LOCK_BATCH_MQ) of every queue of the topic under the
// source's group before reading, a client.GroupConsumer renews them, and a
// split whose lock is lost fails its next Poll with ErrQueueLockLost, so the
// job stops rather than read a queue another process owns. A second process
// of the same job waits in Splits (logging that it does) until the locks
// are free, or fails with ErrQueueLocked after WithLockWait. The broker keeps
// a killed process's locks until they expire (60 s) but grants them at once
// to the same client id. A source made by Dial names its client
// InstanceName(job, checkpoint directory) when the job binds it, so that a
// restarted job re-acquires its queues immediately:
//
//	src, err := rocketmq.Dial("orders", []client.Option{client.WithNameServers(ns)},
//		rocketmq.WithQueueLocking(true))
//	defer src.Close() // after Run: releases the locks and closes the client
//
// A source made by New shares the user's Client, whose name was fixed when
// it was made: build that Client with
// client.WithInstanceName(InstanceName(jobName, checkpointDir)) for the same
// effect. Close the Source after the job to release the locks. The sources
// of a job reading several topics with queue locks lock them all in the
// job's group; each source's lock consumer reports only its own topic in
// heartbeats, so the broker's table of the group's subscriptions follows
// the last heartbeat (pulls carry their own subscription and are not
// affected). Give them groups of their own (WithGroup) where a tool reads
// that table.
package rocketmq
