// Package watermill makes RocketMQ a watermill (github.com/ThreeDotsLabs/watermill)
// Pub/Sub on runnel's client: a Publisher (message.Publisher) and a
// Subscriber (message.Subscriber and message.SubscribeInitializer) that work
// with Apache RocketMQ 4.x/5.x and with runnel's embedded broker. They pass
// watermill's universal test suite (pubsub/tests.TestPubSub) with the
// features ConsumerGroups and Persistent, and GuaranteedOrder on
// single-queue topics.
//
// # Clients and ownership
//
// Both take either a *client.Client, which they use but do not own (close it
// after them), or name server addresses, from which they build a Client they
// own and close in Close. A Client is one member of each consumer group it
// joins, so a Subscriber refuses two active subscriptions in one group
// (ErrGroupActive); more members of a group are more Subscribers (more
// Clients), in one process or many.
//
// # Messages
//
// The DefaultMarshaler maps the payload to the body, metadata to user
// properties (names RocketMQ reserves — TAGS, KEYS, UNIQ_KEY, DELAY, … —
// are refused with ErrInvalidMetadata, not escaped), and the UUID to the
// _watermill_message_uuid property and the message key (KEYS). Empty
// payloads and empty metadata values, which RocketMQ cannot carry, are
// flagged in reserved properties. Marshaler and Unmarshaler can be replaced.
// PublisherConfig.ShardingKey (for example ShardingKeyFromMetadata) picks
// the queue by a hash of a key, so that messages with one key stay in order.
//
// # Consumption
//
// Subscribe joins the topic's consumer group (SubscriberConfig.ConsumerGroup,
// or GenerateConsumerGroup(topic), by default "watermill_<topic>"; RocketMQ
// needs every member of a group to subscribe the same topics) with a
// client.GroupConsumer, and runs one goroutine per assigned queue that pulls
// with long polling from the group's committed offset (a new group starts at
// the first stored message, or at the end with OffsetLast). The messages of a
// queue are delivered one at a time: the next waits for the Ack (or Nack) of
// the previous one. Parallelism comes from queues and from group members.
//
// Ack makes the message's offset committable: the committed offset of a
// queue is its contiguous low watermark, stored on the broker with each pull,
// every CommitInterval while messages are processed, and when the queue is
// revoked or the subscription ends. Revocation (a member joined or left)
// stops the queue's loop, commits, and only then lets the group hand the
// queue over, so the next owner repeats at most the message that was in
// flight. Nack delivers the message again in-process after a short backoff
// (NackResendDelay doubling to NackResendMaxDelay; the broker's own retry
// delays are seconds to hours); with SendBackAfterAttempts the message goes
// to the group's retry topic (%RETRY%<group>, with a delay level) after that
// many nacks, and the subscription consumes that topic as well.
//
// Delivery is at least once, never exactly once: a message delivered but not
// acked when its queue moves, its subscription ends or the process dies is
// delivered again.
//
// # Lifecycle
//
// Cancelling a Subscribe ctx ends that subscription; Subscriber.Close ends
// all. Either way the group is left (queues revoked and committed), every
// goroutine is joined and the output channel is closed; messages in flight
// get their Context cancelled. Publisher.Close waits for Publish calls in
// progress. Both Close methods are idempotent.
//
// # Non-obvious invariants
//
//   - A queue worker's fields (acked, committed, start) belong to its
//     goroutine; OnRevoke reads nothing of them, it cancels the worker and
//     waits for done, which is closed after the final commit.
//   - Only rebalance-listener calls add workers, and they never overlap, so
//     OnAssign can read start offsets without holding sub.mu (no lock is held
//     during a request).
//   - The subscription's ctx keeps the Subscribe ctx's values
//     (context.WithoutCancel) but ends only by teardown, so the group is left
//     and offsets committed even after the caller's ctx was cancelled.
package watermill
