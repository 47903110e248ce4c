package broker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Queue locks for orderly consumption (protocol §7.8): LOCK_BATCH_MQ grants
// a queue to a client if it is free, already the client's, or its lock is
// older than the expiry (60 s); UNLOCK_BATCH_MQ releases the client's
// locks. Locks survive disconnects (they expire) and are not persisted:
// after a restart clients re-lock within their 20 s renew period.

// maxLockQueues bounds the queues of one lock or unlock request.
const maxLockQueues = 1 << 16

// queueLock is the holder of one queue's lock.
type queueLock struct {
	clientID   string
	lastUpdate time.Time
}

// lockManager holds the queue locks of every consumer group. Safe for
// concurrent use.
type lockManager struct {
	b      *Broker
	expiry time.Duration

	mu struct {
		sync.Mutex
		groups map[string]map[protocol.MessageQueue]*queueLock
	}
}

func newLockManager(b *Broker, cfg *subsystemConfig) *lockManager {
	l := &lockManager{b: b, expiry: cfg.lockExpiry}
	l.mu.groups = make(map[string]map[protocol.MessageQueue]*queueLock)
	return l
}

func (l *lockManager) register(s *remoting.Server) {
	s.Handle(protocol.ReqLockBatchMq, remoting.ProcessorFunc(l.processLock))
	s.Handle(protocol.ReqUnlockBatchMq, remoting.ProcessorFunc(l.processUnlock))
}

func (l *lockManager) expired(lk *queueLock, now time.Time) bool {
	return now.Sub(lk.lastUpdate) > l.expiry
}

// tryLock locks or renews each queue for clientID where allowed and
// returns the queues the client now holds, in request order.
func (l *lockManager) tryLock(group, clientID string, mqs []protocol.MessageQueue) []protocol.MessageQueue {
	now := l.b.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.mu.groups[group]
	if g == nil {
		g = make(map[protocol.MessageQueue]*queueLock)
		l.mu.groups[group] = g
	}
	locked := make([]protocol.MessageQueue, 0, len(mqs))
	seen := make(map[protocol.MessageQueue]struct{}, len(mqs))
	for _, mq := range mqs {
		if _, dup := seen[mq]; dup {
			continue
		}
		seen[mq] = struct{}{}
		lk := g[mq]
		switch {
		case lk == nil:
			g[mq] = &queueLock{clientID: clientID, lastUpdate: now}
		case lk.clientID == clientID || l.expired(lk, now):
			lk.clientID, lk.lastUpdate = clientID, now
		default:
			continue
		}
		locked = append(locked, mq)
	}
	if len(g) == 0 {
		delete(l.mu.groups, group)
	}
	return locked
}

// unlock releases the queues of mqs that clientID holds.
func (l *lockManager) unlock(group, clientID string, mqs []protocol.MessageQueue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.mu.groups[group]
	for _, mq := range mqs {
		if lk := g[mq]; lk != nil && lk.clientID == clientID {
			delete(g, mq)
		}
	}
	if g != nil && len(g) == 0 {
		delete(l.mu.groups, group)
	}
}

// groupHoldsLocks reports whether any client of group holds an unexpired
// queue lock: the group consumes orderly (retry rule of §7.3).
func (l *lockManager) groupHoldsLocks(group string) bool {
	now := l.b.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lk := range l.mu.groups[group] {
		if !l.expired(lk, now) {
			return true
		}
	}
	return false
}

// purgeExpired forgets expired locks so abandoned groups do not pile up.
func (l *lockManager) purgeExpired() {
	now := l.b.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, g := range l.mu.groups {
		for mq, lk := range g {
			if l.expired(lk, now) {
				delete(g, mq)
			}
		}
		if len(g) == 0 {
			delete(l.mu.groups, name)
		}
	}
}

func decodeLockBody(req *protocol.Command) (protocol.LockBatchRequestBody, error) {
	var body protocol.LockBatchRequestBody
	if err := body.Decode(req.Body); err != nil {
		return body, &protocol.Error{Code: protocol.ResSystemError, Remark: err.Error()}
	}
	switch {
	case body.ConsumerGroup == "":
		return body, &protocol.Error{Code: protocol.ResSystemError, Remark: "lock request without consumerGroup"}
	case body.ClientID == "":
		return body, &protocol.Error{Code: protocol.ResSystemError, Remark: "lock request without clientId"}
	case len(body.MQSet) > maxLockQueues:
		return body, &protocol.Error{Code: protocol.ResSystemError,
			Remark: fmt.Sprintf("lock request names %d queues, more than %d", len(body.MQSet), maxLockQueues)}
	}
	return body, nil
}

func (l *lockManager) processLock(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	body, err := decodeLockBody(req)
	if err != nil {
		return nil, err
	}
	out := protocol.LockBatchResponseBody{LockOKMQSet: l.tryLock(body.ConsumerGroup, body.ClientID, body.MQSet)}
	b, err := out.Encode()
	if err != nil {
		return nil, err
	}
	resp := protocol.NewResponse(req, protocol.ResSuccess, "")
	resp.Body = b
	return resp, nil
}

func (l *lockManager) processUnlock(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	body, err := decodeLockBody(req)
	if err != nil {
		return nil, err
	}
	l.unlock(body.ConsumerGroup, body.ClientID, body.MQSet)
	return protocol.NewResponse(req, protocol.ResSuccess, ""), nil
}
