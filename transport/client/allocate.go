package client

import (
	"crypto/md5"
	"encoding/binary"
	"slices"
	"strconv"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Allocator decides which queues of one topic a member of a consumer group
// owns. Every member of the group runs the same Allocator over the same
// inputs and keeps only its own share, so an Allocator must be a pure,
// deterministic function of its arguments, and the shares it computes for
// all members of a list must partition the queues (each queue in exactly
// one share) — otherwise two members consume the same queue or a queue is
// consumed by nobody.
//
// members holds the client ids of the group, sorted, without duplicates;
// queues holds the readable queues of the topic sorted by
// protocol.MessageQueue.Compare. The GroupConsumer guarantees both and
// never calls Allocate when self is missing from members. Allocate must not
// modify its arguments; the caller owns the returned slice. Allocate may be
// called from any goroutine, also concurrently.
type Allocator interface {
	Allocate(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue
}

// AllocatorFunc adapts a function to the Allocator interface.
type AllocatorFunc func(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue

// Allocate calls f.
func (f AllocatorFunc) Allocate(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
	return f(self, members, queues)
}

// memberIndex returns the position of self in the sorted members, or -1.
func memberIndex(self string, members []string) int {
	i, ok := slices.BinarySearch(members, self)
	if !ok {
		// Tolerate an unsorted list from a custom caller.
		return slices.Index(members, self)
	}
	return i
}

// AllocateAveragely returns RocketMQ's default strategy
// (AllocateMessageQueueAveragely): the sorted queues are cut into
// contiguous blocks, one per member in member order; with n queues and c
// members every block has n/c queues and the first n%c members get one
// more. With more members than queues the last c-n members get nothing.
// The result is identical to the Java and Go clients', so runnel members
// can share a group with them.
func AllocateAveragely() Allocator { return AllocatorFunc(allocateAveragely) }

func allocateAveragely(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
	idx := memberIndex(self, members)
	n, c := len(queues), len(members)
	if idx < 0 || n == 0 {
		return nil
	}
	size, start := n/c, 0
	if mod := n % c; idx < mod {
		size++
		start = idx * size
	} else {
		start = idx*size + mod
	}
	if start >= n || size == 0 {
		return nil
	}
	return slices.Clone(queues[start:min(start+size, n)])
}

// AllocateAveragelyByCircle returns RocketMQ's
// AllocateMessageQueueAveragelyByCircle: queue i goes to member i mod c,
// dealing the sorted queues round-robin over the sorted members (so the
// queues of one broker spread over all members).
func AllocateAveragelyByCircle() Allocator { return AllocatorFunc(allocateByCircle) }

func allocateByCircle(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
	idx := memberIndex(self, members)
	if idx < 0 || idx >= len(queues) {
		return nil
	}
	out := make([]protocol.MessageQueue, 0, (len(queues)-idx+len(members)-1)/len(members))
	for i := idx; i < len(queues); i += len(members) {
		out = append(out, queues[i])
	}
	return out
}

// DefaultVirtualNodes is the number of ring points per member used by
// AllocateConsistentHash when given a count ≤ 0 (the Java default).
const DefaultVirtualNodes = 10

// AllocateConsistentHash returns a consistent-hash strategy in the manner of
// RocketMQ's AllocateMessageQueueConsistentHash: each member is placed on a
// hash ring at virtualNodes points (keys "<clientID>-<i>"), each queue at
// one point (key "MessageQueue [topic=…, brokerName=…, queueId=…]"), and a
// queue belongs to the first member point at or after it, wrapping around.
// The hash is the first four bytes of the MD5 digest, big-endian, as in the
// Java client. Its property: when a member joins, queues move only to the
// new member; when one leaves, only its queues move. Shares are less even
// than AllocateAveragely's, more so with few virtual nodes.
//
// virtualNodes ≤ 0 means DefaultVirtualNodes. The returned Allocator builds
// its ring on each call; it is safe for concurrent use.
func AllocateConsistentHash(virtualNodes int) Allocator {
	if virtualNodes <= 0 {
		virtualNodes = DefaultVirtualNodes
	}
	return AllocatorFunc(func(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
		return allocateConsistentHash(virtualNodes, self, members, queues)
	})
}

type ringPoint struct {
	hash   uint32
	member int // index into members
}

func md5Prefix(key []byte) uint32 {
	d := md5.Sum(key)
	return binary.BigEndian.Uint32(d[:4])
}

func allocateConsistentHash(vnodes int, self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
	idx := memberIndex(self, members)
	if idx < 0 || len(queues) == 0 {
		return nil
	}
	ring := make([]ringPoint, 0, vnodes*len(members))
	var key []byte
	for m, id := range members {
		for i := range vnodes {
			key = append(append(append(key[:0], id...), '-'), strconv.Itoa(i)...)
			ring = append(ring, ringPoint{hash: md5Prefix(key), member: m})
		}
	}
	// On equal hashes the point added last wins, as with Java's TreeMap.put:
	// a stable sort keeps insertion order, then the last of each run stays.
	slices.SortStableFunc(ring, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	})
	w := 0
	for i := range ring {
		if w > 0 && ring[w-1].hash == ring[i].hash {
			ring[w-1] = ring[i]
			continue
		}
		ring[w] = ring[i]
		w++
	}
	ring = ring[:w]
	var out []protocol.MessageQueue
	for _, q := range queues {
		key = append(key[:0], "MessageQueue [topic="...)
		key = append(key, q.Topic...)
		key = append(key, ", brokerName="...)
		key = append(key, q.BrokerName...)
		key = append(key, ", queueId="...)
		key = strconv.AppendInt(key, int64(q.QueueID), 10)
		key = append(key, ']')
		h := md5Prefix(key)
		i, _ := slices.BinarySearchFunc(ring, h, func(p ringPoint, h uint32) int {
			switch {
			case p.hash < h:
				return -1
			case p.hash > h:
				return 1
			}
			return 0
		})
		if i == len(ring) {
			i = 0
		}
		if ring[i].member == idx {
			out = append(out, q)
		}
	}
	return out
}

// AllocateByConfig returns a strategy that ignores membership and always
// owns the given queues (RocketMQ's AllocateMessageQueueByConfig), limited to
// those present in the topic's current queue list. Each member is configured
// with its own list; that the lists partition the queues is the
// operator's responsibility. The Allocator keeps a copy of queues.
func AllocateByConfig(queues ...protocol.MessageQueue) Allocator {
	fixed := slices.Clone(queues)
	slices.SortFunc(fixed, protocol.MessageQueue.Compare)
	fixed = slices.Compact(fixed)
	return AllocatorFunc(func(self string, _ []string, all []protocol.MessageQueue) []protocol.MessageQueue {
		var out []protocol.MessageQueue
		for _, q := range fixed {
			if _, ok := slices.BinarySearchFunc(all, q, protocol.MessageQueue.Compare); ok {
				out = append(out, q)
			}
		}
		return out
	})
}
