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
// loop per name server, and the subsystems' background loops; the remoting
// server owns the per-connection goroutines. Shutdown and Close join them
// all. Locks: topic and group tables are copy-on-write (readers take no
// lock); longPoll.mu is a leaf lock, never held while answering or calling
// the store's write path.
package broker
