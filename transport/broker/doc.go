// Package broker is runnel's embedded Apache RocketMQ broker: a real
// broker, speaking RocketMQ's remoting protocol, that unmodified RocketMQ
// clients (the official Go client github.com/apache/rocketmq-client-go/v2
// among them) produce to and consume from. Messages, consumer offsets and
// topic and group configs live in a Pebble store under the data dir.
//
//	b, err := broker.New(broker.WithDataDir(dir), broker.WithListenAddr("127.0.0.1:0"),
//		broker.WithNameServers(nsAddr))
//	if err != nil { … }
//	if err := b.Start(ctx); err != nil { … }
//	defer b.Shutdown(ctx)
//	fmt.Println(b.Addr())
//
// # What it serves
//
// Sends (SEND_MESSAGE 10, SEND_MESSAGE_V2 310, SEND_BATCH_MESSAGE 320,
// SEND_REPLY_MESSAGE 324/325) with Java's validation order and codes,
// auto-creation of topics from TBW102, UNIQ_KEY and CLUSTER added as a Java
// broker does, atomic batches with consecutive offsets. Pulls (11, 361)
// with tag filtering, the offset → status mapping of protocol §7.5, the
// commit-offset piggyback and long polling. Offsets and queries (14, 15,
// 29–33, 12), admin requests (17, 215, 21, 351, 200, 201, 207, 202, 208).
// UPDATE_BROKER_CONFIG (25) changes only an allow-list of pull and
// long-polling limits (processor_config.go; any other key is refused with
// NO_PERMISSION), GET_BROKER_CONFIG (26) shows the harmless settings.
// Sends are refused with SERVICE_NOT_AVAILABLE while the data dir's disk is
// above WithDiskHighWatermark ("[DISK_FULL]", resuming by itself) and after
// the store failed a write or fsync ("[STORE_FAILED]", fail-stop until a
// restart; a failed fsync is never retried). A WAL failure while Pebble
// switches to a new WAL file (once per memtable) ends the process instead,
// as Pebble panics there; a restart finds every acknowledged message. The
// client registry, queue locks,
// retry/DLQ, delay levels, timers and reply push are plugged in through the
// extensions seam (subsystems.go). Transactional messages (half messages,
// END_TRANSACTION 37, CHECK_TRANSACTION_STATE 39 check-back, discard to
// TRANS_CHECK_MAX_TIME_TOPIC) are described in transaction.go; an end's
// outcome is stored atomically with its effect (a rollback's op record; a
// commit's final message, indexed as its own op record), so ends are
// idempotent and survive crashes.
//
// # Name servers
//
// The broker keeps one long-lived connection per name server and sends its
// full topic table (REGISTER_BROKER) at Start, every register interval
// (30 s), right after a topic is created or deleted, and after a lost
// connection comes back; Shutdown sends UNREGISTER_BROKER.
//
// # High availability
//
// A broker is a master (RoleAsyncMaster, the default, or RoleSyncMaster;
// broker id 0) or a slave (RoleSlave, WithBrokerID above 0, the master's
// broker and cluster names, a data directory of its own), as in RocketMQ's
// master/slave deployment (ha*.go). A slave connects to its master's HA
// port (WithMasterHAAddr, else the HA address the name servers answer its
// registration with), reports how far its log goes, and the master streams
// its log from there; the slave appends what it receives at the master's
// offsets and reports again. A SYNC_MASTER answers a send once a slave
// reported it has it: SEND_OK, or, after the slave timeout, or at once when
// no slave is in sync, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE (stored
// either way; Java 4.x's isSlaveOK and GroupTransferService rules). A slave
// refuses sends (SERVICE_NOT_AVAILABLE) and END_TRANSACTION
// (SLAVE_NOT_AVAILABLE), serves pulls and queries, runs no delivery of delay
// levels or timers and no transaction check-back (its master's results
// reach it through the log), and copies its master's topic configs,
// subscription groups, consumer offsets and delay offsets every sync
// interval. Pulls carry suggestWhichBrokerId by RocketMQ's rule (see
// WithSlaveRead); a slave sends a consumer that is not far behind back to a
// live master.
//
// The log. RocketMQ replicates its commit log, one byte stream in which
// every message has a physical offset; its consume queues and index are
// rebuilt from it. runnel's store has no commit log file, but it keeps the
// same numbering: every record gets a physical offset from one store-wide
// counter (the sum of the sizes of the records before it), its record bytes
// are RocketMQ's commit log bytes for that message, and a physical index
// keeps them in that order. The log that replicates is that sequence:
// offsets are physical offsets, a slave's position is its log end (the
// offset after its last record), and the master reads the log from an
// offset by walking its physical index (Store.ReadLog). Each record goes
// with its consume queue's tags code and its key index keys (the transfer
// body's dispatch data), because some of runnel's index keys (a
// transaction commit's) are not derivable from the record; the slave stores
// each record under the queue and queue offset the record names, with the
// same physical offset and store time, so that pulls, offsets, message ids
// (store host + physical offset), VIEW_MESSAGE_BY_ID, QUERY_MESSAGE and
// SEARCH_OFFSET_BY_TIMESTAMP answer the same on both. Why not replicate
// Pebble itself (its WAL or SSTs): the master's Pebble holds state a slave
// must not share (transaction check counts, timer indexes, its own consumer
// offsets while a slave keeps those committed to it), and a record stream
// keeps the slave's store an ordinary store the broker reads like its own.
// A topic deletion removes records from the middle of the log; the master
// appends a record to rmq_sys_runnel_ha_ops right after it (under the same
// hold of the append lock), and the slave replays the deletion where that
// record is, so a topic deleted and created again keeps only its new
// records on the slave. Holes left by deleted records are skipped.
//
// Divergence. Every start of a master begins an epoch of its log (epoch
// number, start offset, kept in the store; AutoSwitchHA's epoch file), and
// every store has a log id, a master's made at its first start and taken
// by its slave. At the handshake the master sends its identity (cluster,
// broker name, address, log id) and its epochs; a master refuses a slave of
// another broker name or cluster, or holding another master's log, and the
// slave refuses such a master, both saying why (SHUTDOWN frame, logs,
// HAStatus.Master.LastError). The slave then removes its log from the last
// point where its epochs agree with the master's (an ASYNC master that lost
// the tail of its log in a crash and wrote other records at those offsets
// since: the slave's tail is not the master's) and asks from there, so two
// histories are never mixed.
//
// Bounds. A master holds one transfer frame per slave (at most the batch
// size and one record) and writes it with a deadline of the housekeeping
// interval: a slave that stops reading blocks only its own writer, and is
// dropped after that interval; one that falls behind is fed from the store,
// never from a backlog kept for it. HAStatus (and GET_BROKER_HA_STATUS,
// `runnel broker status`, package otel) reports log ends, each slave's
// acknowledged offset and lag, bytes sent and received, and the SYNC_MASTER
// outcomes.
//
// # Long polling
//
// A pull with the SUSPEND flag that finds nothing new is parked for
// min(suspendTimeoutMillis, the configured cap, 25 s by default). The
// store's notify hook wakes the pulls of a queue as soon as a write to it
// is durable; a deadline heap answers the others. The number of parked
// pulls is bounded; beyond it a pull is answered SYSTEM_BUSY, which makes
// clients back off for 3 s rather than spin.
//
// # Goroutines
//
// The broker owns: the accept loop, the long-poll loop, one registration
// loop per name server, the subsystems' background loops, and for HA a
// master's HA accept loop (which owns two goroutines per slave connection,
// reader and writer) and SYNC_MASTER waiter loop, or a slave's replication
// loop (which owns its session's heartbeat goroutine) and metadata copy
// loop; the remoting server owns the per-connection goroutines. Shutdown and Close join them
// all. Locks: topic and group tables are copy-on-write (readers take no
// lock); longPoll.mu is a leaf lock, never held while answering or calling
// the store's write path.
package broker
