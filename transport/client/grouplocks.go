package client

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Queue locks for callers that manage them themselves (a GroupConsumer not
// in locking mode), such as runnel's scale-out workers, which take a queue
// whose lock is held by a member that has left the group without waiting
// for the broker to expire that lock (their commit chain fences the old
// holder instead).

// LockQueues asks the queues' brokers for their locks on behalf of this
// member (LOCK_BATCH_MQ) and returns the granted ones, sorted. Asking again
// for a queue the member holds renews its lock. Queues whose broker has no
// master or does not answer are not granted. It blocks for the requests,
// each bounded by the group timeout and ctx.
func (g *GroupConsumer) LockQueues(ctx context.Context, qs ...protocol.MessageQueue) []protocol.MessageQueue {
	g.lockMu.Lock()
	defer g.lockMu.Unlock()
	return g.lock(ctx, qs)
}

// UnlockQueues releases this member's locks of qs (UNLOCK_BATCH_MQ; best
// effort: a lock not released expires on the broker).
func (g *GroupConsumer) UnlockQueues(ctx context.Context, qs ...protocol.MessageQueue) {
	g.lockMu.Lock()
	defer g.lockMu.Unlock()
	g.unlock(ctx, qs)
}

// UnlockQueuesFor releases the locks of qs that another member, clientID,
// holds: for a member that left the group (killed) whose locks would
// otherwise stay until the broker expires them (60 s by default in Apache
// RocketMQ), so that the queue's next owner can lock it at once. Best
// effort, as UnlockQueues. Only for a clientID known to have left: a live
// member loses its lock.
func (g *GroupConsumer) UnlockQueuesFor(ctx context.Context, clientID string, qs ...protocol.MessageQueue) {
	g.lockMu.Lock()
	defer g.lockMu.Unlock()
	g.unlockFor(ctx, clientID, qs)
}

// Members returns the group's member client ids, sorted, as a broker of
// topic lists them (GET_CONSUMER_LIST_BY_GROUP).
func (g *GroupConsumer) Members(ctx context.Context, topic string) ([]string, error) {
	r, err := g.c.Route(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("client: group %s: route of %s: %w", g.group, topic, err)
	}
	ids, err := g.members(ctx, r)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("client: group %s: members", g.group), err)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}
