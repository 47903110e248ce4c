package broker

import (
	"fmt"
	"slices"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Orderly POP (Java ConsumerOrderInfoManager): per group and queue the
// batch last handed out, which offsets of it were acked, per offset its
// next visible time (CHANGE_MESSAGE_INVISIBLETIME) and how often it was
// handed out. The queue is blocked while an un-acked offset of the batch
// is still invisible; the group's committed offset stays at the first
// un-acked offset, so an expired batch is handed out again from there,
// in order, with its counts (orderCountInfo).

type orderKey struct {
	topic, group string
	queue        int32
}

type orderInfo struct {
	attemptID     string
	popTime       int64 // ms
	invisible     int64 // ms
	offsets       []int64
	acked         uint64 // bit i: offsets[i] acked
	nextVisible   map[int64]int64
	consumedCount map[int64]int // by offset: times handed out before this batch
}

func (o *orderInfo) acked0(i int) bool { return o.acked&(1<<i) != 0 }

// blocked is Java's OrderInfo.needBlock.
func (o *orderInfo) blocked(attemptID string, invisible int64, now int64) bool {
	if len(o.offsets) == 0 {
		return false
	}
	if o.attemptID != "" && o.attemptID == attemptID {
		return false
	}
	if o.invisible <= 0 {
		o.invisible = invisible
	}
	for i, off := range o.offsets {
		if o.acked0(i) {
			continue
		}
		visible := o.popTime + o.invisible
		if t, ok := o.nextVisible[off]; ok {
			visible = t
		}
		if now < visible {
			return true
		}
	}
	return false
}

// nextOffset is the first un-acked offset, or one past the batch.
func (o *orderInfo) nextOffset() int64 {
	for i, off := range o.offsets {
		if !o.acked0(i) {
			return off
		}
	}
	return o.offsets[len(o.offsets)-1] + 1
}

func (p *popService) orderBlocked(topic, group string, queue int32, attemptID string, invisible int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.mu.order[orderKey{topic, group, queue}]
	return o != nil && o.blocked(attemptID, invisible, p.nowMS())
}

// orderUpdate records a new batch of the queue and appends its
// orderCountInfo (Java ConsumerOrderInfoManager.update): offsets handed
// out before count one more; a count per offset that has one, then the
// queue's minimum (for old clients).
func (p *popService) orderUpdate(topic, group string, queue int32, attemptID string, popTime, invisible int64,
	offsets []int64, info []byte) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := orderKey{topic, group, queue}
	prev := p.mu.order[k]
	o := &orderInfo{attemptID: attemptID, popTime: popTime, invisible: invisible, offsets: slices.Clone(offsets)}
	switch {
	case prev == nil:
	case prev.attemptID != "" && prev.attemptID == attemptID:
		o.consumedCount = prev.consumedCount
	default:
		for _, off := range o.offsets {
			if slices.Contains(prev.offsets, off) {
				if o.consumedCount == nil {
					o.consumedCount = map[int64]int{}
				}
				o.consumedCount[off] = prev.consumedCount[off] + 1
			}
		}
	}
	p.mu.order[k] = o
	minCount := 0
	if len(o.consumedCount) > 0 {
		minCount = int(^uint(0) >> 1)
		offs := make([]int64, 0, len(o.consumedCount))
		for off := range o.consumedCount {
			offs = append(offs, off)
		}
		slices.Sort(offs)
		for _, off := range offs {
			n := o.consumedCount[off]
			info = protocol.AppendOrderCountInfo(info, topic, queue, off, n)
			minCount = min(minCount, n)
		}
		if len(o.consumedCount) != len(o.offsets) {
			minCount = 0
		}
	}
	return protocol.AppendOrderCountInfo(info, topic, queue, -1, minCount)
}

// ackOrderly acks offset off of the queue's batch popped at popTime (Java
// AckMessageProcessor.ackOrderly): the group's offset moves to the first
// un-acked one, and pops waiting for the queue are woken once it is no
// longer blocked. An ack below the committed offset is a no-op; one the
// batch does not hold is MESSAGE_ILLEGAL.
func (p *popService) ackOrderly(req *protocol.Command, topic, group string, queue int32, off, popTime int64) *protocol.Command {
	lk := p.queueLock(popLockKey(topic, group, queue))
	lk.Lock()
	defer lk.Unlock()
	committed, ok, err := p.b.store.QueryOffset(group, topic, queue)
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	if ok && off < committed {
		return nil
	}
	p.mu.Lock()
	o := p.mu.order[orderKey{topic, group, queue}]
	next := off + 1 // no batch known (a restart): Java commits offset + 1
	if o != nil {
		if o.popTime != popTime {
			p.mu.Unlock()
			return nil // an older batch's handle (Java: -2, ignored)
		}
		i := slices.Index(o.offsets, off)
		if i < 0 {
			p.mu.Unlock()
			return respond(req, protocol.ResMessageIllegal, fmt.Sprintf("offset is illegal, key:%s, old:%d, commit:%d, next:%d",
				popLockKey(topic, group, queue), committed, off, -1))
		}
		o.acked |= 1 << i
		next = o.nextOffset()
	}
	unblocked := o == nil || !o.blocked("", 0, p.nowMS())
	p.mu.Unlock()
	mb := p.b.store.NewMetaBatch()
	mb.CommitOffset(group, topic, queue, next)
	if err := mb.Commit(p.syncMeta()); err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	if unblocked {
		p.waiters.wake(topic, group, queue)
	}
	return nil
}

// orderChangeVisible moves the next visible time of an orderly offset and
// returns it (Java processChangeInvisibleTimeForOrder).
func (p *popService) orderChangeVisible(topic, group string, queue int32, off, popTime, invisible int64) int64 {
	visible := p.nowMS() + invisible
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.mu.order[orderKey{topic, group, queue}]
	if o == nil || o.popTime != popTime {
		return visible
	}
	if o.nextVisible == nil {
		o.nextVisible = map[int64]int64{}
	}
	o.nextVisible[off] = visible
	return visible
}
