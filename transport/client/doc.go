// Package client is runnel's RocketMQ client: name-server routes,
// producers, pull primitives, offsets, admin calls and consumer groups, over
// the remoting protocol (package remoting) with the codecs of package
// protocol. It works against Apache RocketMQ 4.x/5.x clusters and against
// runnel's embedded broker (package broker).
//
// # Client
//
// New returns a running Client: name servers (fixed addresses with
// failover, or fetched from an HTTP address service every 2 min), a route
// cache refreshed every 30 s, one multiplexed connection per broker address
// (dialled on first use and again, with a backoff, after it breaks),
// heartbeats every 30 s to the brokers in use, ACL signing (WithCredentials)
// and TLS with certificate verification (WithTLSConfig). Every blocking call
// takes a ctx first; without a deadline a request gets the request timeout
// (3 s). Close stops and joins every goroutine the Client, its producers and
// its consumer groups started, and closes the connections. There is no
// package-level state: Clients with different settings coexist.
//
// # Producer
//
// NewProducer(c, group) returns a Producer. Send stores one message, or a
// batch for one topic, and waits; SendAsync calls back; SendOneway does not
// ask for an answer. Messages are validated before anything is sent
// (ErrInvalidMessage). Queues are chosen round robin with RocketMQ's latency
// fault tolerance (slow or failed brokers are avoided for a while, the least
// bad one is used when all are avoided), by HashBySharding for ordered
// messages, or by any QueueSelector; a failed synchronous send is retried
// twice, preferring another broker. Bodies of 4 KiB and more are
// zlib-compressed. Topics the name servers do not know yet are routed
// through TBW102 so that the broker creates them.
//
// MaybeApplied(err) tells "sent, outcome unknown" (a timeout or a lost
// connection after the request was written) from failures that surely
// stored nothing; exactly-once code must treat the former as possibly
// stored.
//
// SendHalf stores a transactional half message and returns a TxHandle, plain
// data that can be kept in a checkpoint; EndTransaction commits or rolls it
// back later, from any Producer of the group. WithCheckListener answers the
// broker's check-backs.
//
// # Pull
//
// Client.Pull reads one queue from an explicit offset, with long polling,
// TAG or SQL92 filtering, and typed outcomes (PullFound, PullNoNewMsg,
// PullNoMatchedMsg, PullOffsetIllegal). Pulled messages alias one response
// buffer. MinOffset, MaxOffset, SearchOffset, QueryConsumerOffset and
// CommitOffset read and write offsets on the broker.
//
// # Admin
//
// CreateTopic (on a broker or a whole cluster), DeleteTopic, ListTopics,
// ClusterInfo and ConsumerOffsets.
//
// # Performance notes
//
// Send requests are encoded with the generated typed headers (compact
// SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE keys) into pooled commands; the
// properties string is built once per message; nothing on the send or pull
// path uses reflection. Concurrent sends pipeline on one connection per
// broker.
//
// # Non-obvious invariants
//
// What a user of the package can rely on (the implementation's own
// invariants are stated where they live, in client.go and producer.go):
//
//   - Connections are replaced, never repaired: a connection found closed
//     by a request is dialled anew. One dial per address is in flight at a
//     time; after a failure the next dial waits a backoff (50 ms doubling to
//     2 s), and a caller whose ctx ends sooner gets the last dial error at
//     once.
//   - Close waits for every goroutine the Client started (heartbeats,
//     route polls, consumers, check-back handlers); nothing the Client
//     started runs after Close returns, and no call started after it begins.
//   - No lock of the Client is held while a request is made or a handler,
//     hook or callback runs (the locks are never nested either).
//   - A request is encoded before the call that sends it returns: the
//     producers reuse their pooled requests and body buffers at once.
package client
