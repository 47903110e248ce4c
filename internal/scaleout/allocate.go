package scaleout

import (
	"cmp"
	"hash/fnv"
	"slices"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Sticky returns the allocator the workers of a job use for their tasks:
// balanced rendezvous hashing. Every (member, queue) pair gets a score; the
// pairs are dealt in score order, each queue to its best-scoring member that
// still has room, where room is an even share (n/c queues each, and n%c
// members one more). Like every client.Allocator it is a pure function of
// the sorted member and queue lists, so all members agree; unlike
// RocketMQ's averaging strategies, which cut the queue list into blocks and
// shift every block when one member joins, a member joining or leaving
// moves about 1/c of the queues: only those the change must move, plus a
// few to keep the shares even.
func Sticky() client.Allocator { return client.AllocatorFunc(allocateSticky) }

func allocateSticky(self string, members []string, queues []protocol.MessageQueue) []protocol.MessageQueue {
	owner := assignSticky(members, queues)
	var mine []protocol.MessageQueue
	for i, q := range queues {
		if owner[i] == self {
			mine = append(mine, q)
		}
	}
	return mine
}

type scored struct {
	score uint64
	q, m  int
}

// assignSticky returns the owner of every queue.
func assignSticky(members []string, queues []protocol.MessageQueue) []string {
	n, c := len(queues), len(members)
	owner := make([]string, n)
	if n == 0 || c == 0 {
		return owner
	}
	pairs := make([]scored, 0, n*c)
	for qi, q := range queues {
		qs := q.String()
		for mi, m := range members {
			pairs = append(pairs, scored{score: pairScore(m, qs), q: qi, m: mi})
		}
	}
	slices.SortFunc(pairs, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.m, b.m); c != 0 {
			return c
		}
		return cmp.Compare(a.q, b.q)
	})
	floor, extra := n/c, n%c
	count := make([]int, c)
	done := make([]bool, n)
	for _, p := range pairs {
		if done[p.q] {
			continue
		}
		switch {
		case count[p.m] < floor:
		case count[p.m] == floor && extra > 0:
			extra--
		default:
			continue
		}
		done[p.q] = true
		count[p.m]++
		owner[p.q] = members[p.m]
	}
	return owner
}

// StandbyOf returns the member that keeps a warm copy of queue q's task for
// its owner: the best-scoring member other than the owner ("" with fewer
// than two members). When the owner leaves, rendezvous hashing most often
// hands q to exactly this member.
func StandbyOf(members []string, queues []protocol.MessageQueue, q protocol.MessageQueue) string {
	owner := assignSticky(members, queues)
	i := slices.Index(queues, q)
	if i < 0 || len(members) < 2 {
		return ""
	}
	qs := q.String()
	best, bestScore := "", uint64(0)
	for _, m := range members {
		if m == owner[i] {
			continue
		}
		if s := pairScore(m, qs); best == "" || s > bestScore {
			best, bestScore = m, s
		}
	}
	return best
}

func pairScore(member, queue string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(queue))
	// fnv's low bits mix poorly for similar inputs: finish with a
	// splitmix64 step.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
