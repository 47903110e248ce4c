package client

import (
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// QueueSelector chooses the queue a message goes to among the topic's
// writable queues (never empty, sorted by broker name then queue id). It
// must be safe for concurrent use and must return one of queues.
type QueueSelector interface {
	Select(msg *Message, queues []protocol.MessageQueue) protocol.MessageQueue
}

// SelectorFunc adapts a function to QueueSelector.
type SelectorFunc func(msg *Message, queues []protocol.MessageQueue) protocol.MessageQueue

// Select calls f.
func (f SelectorFunc) Select(msg *Message, queues []protocol.MessageQueue) protocol.MessageQueue {
	return f(msg, queues)
}

type roundRobinSelector struct{ n atomic.Uint32 }

func (s *roundRobinSelector) Select(_ *Message, queues []protocol.MessageQueue) protocol.MessageQueue {
	return queues[int(s.n.Add(1)%uint32(len(queues)))]
}

// RoundRobin returns the default selector: queues in turn. Given to
// WithSelector it keeps the producer's latency fault tolerance and its
// failover to another broker on retries.
func RoundRobin() QueueSelector { return &roundRobinSelector{} }

func isRoundRobin(s QueueSelector) bool { _, ok := s.(*roundRobinSelector); return ok }

type hashSelector struct{ rr roundRobinSelector }

func (s *hashSelector) Select(m *Message, queues []protocol.MessageQueue) protocol.MessageQueue {
	if m == nil || m.ShardingKey == "" {
		return s.rr.Select(m, queues)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(m.ShardingKey))
	return queues[int(h.Sum32()%uint32(len(queues)))]
}

// HashBySharding returns a selector that sends messages with equal
// ShardingKey to the same queue (FNV-32a of the key modulo the queue count,
// as rocketmq-client-go's hash selector), so they stay in order while the
// queue count does not change. Messages without a key go round robin.
func HashBySharding() QueueSelector { return &hashSelector{} }

// Default fault tables (RocketMQ MQFaultStrategy).
var (
	defaultLatencyMax = []time.Duration{
		50 * time.Millisecond, 100 * time.Millisecond, 550 * time.Millisecond,
		time.Second, 2 * time.Second, 3 * time.Second, 15 * time.Second,
	}
	defaultNotAvailable = []time.Duration{
		0, 0, 30 * time.Second, 60 * time.Second, 120 * time.Second, 180 * time.Second, 600 * time.Second,
	}
)

// isolationLatency is the latency a failed send counts as.
const isolationLatency = 10 * time.Second

// faultStrategy is RocketMQ's MQFaultStrategy: each send's latency makes
// its broker unavailable for the duration the tables give; queue selection
// skips unavailable brokers and, when all are unavailable, takes the least
// bad one (the one available soonest, then the fastest). Safe for
// concurrent use.
type faultStrategy struct {
	enabled      bool
	latencyMax   []time.Duration
	notAvailable []time.Duration
	now          func() time.Time

	mu struct {
		sync.Mutex
		items map[string]faultItem
	}
}

type faultItem struct {
	latency     time.Duration
	availableAt time.Time
}

func newFaultStrategy(enabled bool, latencyMax, notAvailable []time.Duration) *faultStrategy {
	f := &faultStrategy{enabled: enabled, latencyMax: latencyMax, notAvailable: notAvailable, now: time.Now}
	f.mu.items = map[string]faultItem{}
	return f
}

// notAvailableFor returns how long a broker with this latency is avoided.
func (f *faultStrategy) notAvailableFor(latency time.Duration) time.Duration {
	for i := len(f.latencyMax) - 1; i >= 0; i-- {
		if latency >= f.latencyMax[i] {
			return f.notAvailable[i]
		}
	}
	return 0
}

// update records a send to broker that took latency (isolation: it failed).
func (f *faultStrategy) update(broker string, latency time.Duration, isolation bool) {
	if !f.enabled {
		return
	}
	if isolation {
		latency = max(latency, isolationLatency)
	}
	d := f.notAvailableFor(latency)
	f.mu.Lock()
	defer f.mu.Unlock()
	it, ok := f.mu.items[broker]
	if !ok && d == 0 {
		return // healthy and never faulty: nothing to remember
	}
	it.latency, it.availableAt = latency, f.now().Add(d)
	f.mu.items[broker] = it
}

// available reports whether broker may be used now.
func (f *faultStrategy) available(broker string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.availableLocked(broker, f.now())
}

func (f *faultStrategy) availableLocked(broker string, now time.Time) bool {
	it, ok := f.mu.items[broker]
	return !ok || !now.Before(it.availableAt)
}

// pick chooses a queue from queues (non-empty), starting at index start:
// the first available queue not on broker avoid; else the first available
// one; else (all brokers avoided) a queue of the least bad broker. With the
// strategy disabled it only avoids broker avoid.
func (f *faultStrategy) pick(queues []protocol.MessageQueue, start uint32, avoid string) protocol.MessageQueue {
	n := uint32(len(queues))
	if !f.enabled {
		for i := range n {
			if q := queues[(start+i)%n]; q.BrokerName != avoid {
				return q
			}
		}
		return queues[start%n]
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.mu.items) == 0 {
		for i := range n {
			if q := queues[(start+i)%n]; q.BrokerName != avoid {
				return q
			}
		}
		return queues[start%n]
	}
	now := f.now()
	for i := range n {
		q := queues[(start+i)%n]
		if q.BrokerName != avoid && f.availableLocked(q.BrokerName, now) {
			return q
		}
	}
	for i := range n {
		q := queues[(start+i)%n]
		if f.availableLocked(q.BrokerName, now) {
			return q
		}
	}
	// Every broker is avoided: the least bad one.
	best, bestIdx := faultItem{}, -1
	for i := range n {
		q := queues[(start+i)%n]
		it := f.mu.items[q.BrokerName]
		if bestIdx < 0 || it.availableAt.Before(best.availableAt) ||
			(it.availableAt.Equal(best.availableAt) && it.latency < best.latency) {
			best, bestIdx = it, int((start+i)%n)
		}
	}
	return queues[bestIdx]
}
