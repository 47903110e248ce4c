package client

import (
	"context"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Broker queue locks (locking mode of GroupConsumer; protocol reference
// §5.3, §7.8). The broker grants LOCK_BATCH_MQ for a queue that is
// unlocked, locked by the same client id, or whose lock is older than its
// expiry (60 s by default), and answers with the granted subset. A client
// renews its locks every renew interval and trusts a lock for the
// validity (measured from when the granting request was sent), which is
// shorter than the broker's expiry: a member stops using a queue before
// the broker could hand it to another.
//
// lockLoop renews the locks of the owned queues and marks as lost those
// whose renewal the broker refused or whose validity lapsed; the rebalance
// goroutine then reports them (OnLockLost). It never calls the listener,
// so a slow listener never delays renewals.

// lockLoop is the lock renewal goroutine of a GroupConsumer in locking mode.
func (g *GroupConsumer) lockLoop(ctx context.Context) {
	nextRenew := time.Now().Add(g.cfg.lockRenew)
	t := time.NewTimer(g.cfg.lockRenew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.quit:
			return
		case <-t.C:
		}
		if now := time.Now(); !now.Before(nextRenew) {
			g.renewLocks(ctx)
			nextRenew = time.Now().Add(g.cfg.lockRenew)
		}
		wake := nextRenew
		if e, ok := g.expireLocks(time.Now()); ok && e.Before(wake) {
			wake = e
		}
		t.Reset(max(time.Until(wake), time.Millisecond))
	}
}

// expireLocks marks owned queues whose validity lapsed as lost (kicking
// the rebalance goroutine when it did) and returns the earliest validity
// end among the others.
func (g *GroupConsumer) expireLocks(now time.Time) (earliest time.Time, ok bool) {
	g.mu.Lock()
	lost := false
	for _, s := range g.mu.owned {
		if s.lost {
			continue
		}
		if !now.Before(s.lockedUntil) {
			s.lost, lost = true, true
			continue
		}
		if !ok || s.lockedUntil.Before(earliest) {
			earliest, ok = s.lockedUntil, true
		}
	}
	g.mu.Unlock()
	if lost {
		g.kickLost()
	}
	return earliest, ok
}

func (g *GroupConsumer) kickLost() {
	select {
	case g.lostKick <- struct{}{}:
	default:
	}
}

// renewLocks sends LOCK_BATCH_MQ for every owned queue. A queue the broker
// did not grant is marked lost at once; a queue whose request failed keeps
// its validity (it may lapse later).
func (g *GroupConsumer) renewLocks(ctx context.Context) {
	g.lockMu.Lock()
	defer g.lockMu.Unlock()
	g.mu.Lock()
	qs := make([]protocol.MessageQueue, 0, len(g.mu.owned))
	for q, s := range g.mu.owned {
		if !s.lost {
			qs = append(qs, q)
		}
	}
	g.mu.Unlock()
	if len(qs) == 0 {
		return
	}
	slices.SortFunc(qs, protocol.MessageQueue.Compare)
	sent := time.Now()
	until := sent.Add(g.cfg.lockValidity)
	lost := false
	for addr, batch := range g.byBroker(ctx, qs) {
		granted, err := g.lockBatch(ctx, addr, batch)
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn("client: lock renewal failed; locks stay valid until their validity ends", "broker", addr, "queues", len(batch), "err", err)
			}
			continue
		}
		g.mu.Lock()
		for _, q := range batch {
			s, owned := g.mu.owned[q]
			switch {
			case !owned || s.lost:
			case slices.Contains(granted, q):
				s.lockedUntil = until
			default:
				s.lost, lost = true, true
			}
		}
		g.mu.Unlock()
	}
	if lost {
		g.kickLost()
	}
}

// lock asks for the locks of qs and returns the granted ones, sorted.
// Queues whose broker has no master or did not answer are not granted.
// The caller holds lockMu.
func (g *GroupConsumer) lock(ctx context.Context, qs []protocol.MessageQueue) []protocol.MessageQueue {
	var out []protocol.MessageQueue
	for addr, batch := range g.byBroker(ctx, qs) {
		granted, err := g.lockBatch(ctx, addr, batch)
		if err != nil {
			g.log.Warn("client: lock request failed", "broker", addr, "queues", len(batch), "err", err)
			continue
		}
		for _, q := range batch {
			if slices.Contains(granted, q) {
				out = append(out, q)
			}
		}
	}
	slices.SortFunc(out, protocol.MessageQueue.Compare)
	return out
}

// unlock releases the broker locks of qs (best effort: a lock not released
// expires on the broker). The caller holds lockMu.
func (g *GroupConsumer) unlock(ctx context.Context, qs []protocol.MessageQueue) {
	g.unlockFor(ctx, g.c.ClientID(), qs)
}

// unlockFor releases the locks that member clientID holds of qs: a broker
// releases the locks of the client id in the request body, whoever sends
// it (Apache RocketMQ's RebalanceLockManager.unlockBatch does the same).
func (g *GroupConsumer) unlockFor(ctx context.Context, clientID string, qs []protocol.MessageQueue) {
	for addr, batch := range g.byBroker(ctx, qs) {
		body := protocol.UnlockBatchRequestBody{ConsumerGroup: g.group, ClientID: clientID, MQSet: batch}
		b, err := body.Encode()
		if err == nil {
			req := protocol.NewRequest(protocol.ReqUnlockBatchMq)
			req.Body = b
			rctx, cancel := context.WithTimeout(ctx, g.cfg.timeout)
			var resp *protocol.Command
			resp, err = g.c.invoke(rctx, addr, req)
			cancel()
			if err == nil {
				err = protocol.ResponseError(resp)
			}
		}
		if err != nil {
			// Not fatal by design: the broker lock expires by itself, which
			// only delays the next owner.
			g.log.Warn("client: unlock failed; the broker lock will expire", "broker", addr, "queues", len(batch), "err", err)
		}
	}
}

// lockBatch sends one LOCK_BATCH_MQ and returns the granted queues.
func (g *GroupConsumer) lockBatch(ctx context.Context, addr string, qs []protocol.MessageQueue) ([]protocol.MessageQueue, error) {
	body := protocol.LockBatchRequestBody{ConsumerGroup: g.group, ClientID: g.c.ClientID(), MQSet: qs}
	b, err := body.Encode()
	if err != nil {
		return nil, err
	}
	req := protocol.NewRequest(protocol.ReqLockBatchMq)
	req.Body = b
	rctx, cancel := context.WithTimeout(ctx, g.cfg.timeout)
	defer cancel()
	resp, err := g.c.invoke(rctx, addr, req)
	if err != nil {
		return nil, err
	}
	if err := protocol.ResponseError(resp); err != nil {
		return nil, err
	}
	var lb protocol.LockBatchResponseBody
	if err := lb.Decode(resp.Body); err != nil {
		return nil, err
	}
	return lb.LockOKMQSet, nil
}

// byBroker groups qs by the master address of their broker (from the
// topic's route). Queues whose route or master is unknown are left out
// (logged), which callers treat as "not granted" / "not released".
func (g *GroupConsumer) byBroker(ctx context.Context, qs []protocol.MessageQueue) map[string][]protocol.MessageQueue {
	out := make(map[string][]protocol.MessageQueue)
	routes := make(map[string]*TopicRoute)
	for _, q := range qs {
		r, ok := routes[q.Topic]
		if !ok {
			var err error
			if r, err = g.c.Route(ctx, q.Topic); err != nil {
				g.log.Warn("client: no route for lock request", "topic", q.Topic, "err", err)
			}
			routes[q.Topic] = r
		}
		if r == nil {
			continue
		}
		addr, ok := r.MasterAddr(q.BrokerName)
		if !ok {
			g.log.Warn("client: no master for lock request", "queue", q.String())
			continue
		}
		out[addr] = append(out[addr], q)
	}
	return out
}
