package scaleout

import (
	"fmt"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func queuesN(n int) []protocol.MessageQueue {
	qs := make([]protocol.MessageQueue, n)
	for i := range qs {
		qs[i] = protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: int32(i)}
	}
	return qs
}

func membersN(n int) []string {
	ms := make([]string, n)
	for i := range ms {
		ms[i] = fmt.Sprintf("10.0.0.%d@worker", i+1)
	}
	return ms
}

// TestStickyPartitionsEvenly: every queue has exactly one owner, shares
// differ by at most one, and the members' own views (Allocate per member)
// agree with the global assignment.
func TestStickyPartitionsEvenly(t *testing.T) {
	for n := 0; n <= 40; n += 3 {
		for c := 1; c <= 9; c++ {
			qs, ms := queuesN(n), membersN(c)
			owner := assignSticky(ms, qs)
			count := map[string]int{}
			seen := map[protocol.MessageQueue]bool{}
			for _, m := range ms {
				for _, q := range allocateSticky(m, ms, qs) {
					if seen[q] {
						t.Fatalf("n=%d c=%d: %v allocated twice", n, c, q)
					}
					seen[q] = true
					count[m]++
				}
			}
			if len(seen) != n {
				t.Fatalf("n=%d c=%d: %d of %d queues allocated", n, c, len(seen), n)
			}
			for i, o := range owner {
				if !seen[qs[i]] || o == "" {
					t.Fatalf("n=%d c=%d: queue %d owner %q", n, c, i, o)
				}
			}
			for _, m := range ms {
				if k := count[m]; k < n/c || k > (n+c-1)/c {
					t.Fatalf("n=%d c=%d: %s got %d queues", n, c, m, k)
				}
			}
		}
	}
}

// TestStickyMovesFew: a member joining a group of c moves far fewer queues
// than RocketMQ's averaging strategy (which shifts every block), and a
// member leaving moves its own queues plus at most a few.
func TestStickyMovesFew(t *testing.T) {
	qs := queuesN(64)
	moved := func(a, b []string) int {
		n := 0
		for i := range a {
			if a[i] != b[i] {
				n++
			}
		}
		return n
	}
	for c := 2; c <= 8; c++ {
		before := assignSticky(membersN(c), qs)
		after := assignSticky(membersN(c+1), qs)
		// Ideal: 64/(c+1) queues move to the newcomer.
		if m, ideal := moved(before, after), 64/(c+1); m > 2*ideal+2 {
			t.Errorf("join %d→%d: %d queues moved, ideal %d", c, c+1, m, ideal)
		}
		// The averaging strategy, for comparison, moves more.
		avgBefore := assignAveraging(membersN(c), qs)
		avgAfter := assignAveraging(membersN(c+1), qs)
		if mAvg, m := moved(avgBefore, avgAfter), moved(before, after); mAvg <= m {
			t.Logf("join %d→%d: averaging moved %d, sticky %d", c, c+1, mAvg, m)
		}
	}
}

func assignAveraging(ms []string, qs []protocol.MessageQueue) []string {
	out := make([]string, len(qs))
	n, c := len(qs), len(ms)
	for i, m := range ms {
		size, start := n/c, 0
		if mod := n % c; i < mod {
			size++
			start = i * size
		} else {
			start = i*size + mod
		}
		for j := start; j < start+size && j < n; j++ {
			out[j] = m
		}
	}
	return out
}

// TestStandbyBecomesOwner: for most queues, when the owner leaves the
// group, the queue goes to its standby (so failover finds a warm copy).
func TestStandbyBecomesOwner(t *testing.T) {
	qs, ms := queuesN(32), membersN(4)
	owner := assignSticky(ms, qs)
	hits := 0
	for i, q := range qs {
		sb := StandbyOf(ms, qs, q)
		if sb == "" || sb == owner[i] {
			t.Fatalf("queue %d: standby %q, owner %q", i, sb, owner[i])
		}
		var rest []string
		for _, m := range ms {
			if m != owner[i] {
				rest = append(rest, m)
			}
		}
		if assignSticky(rest, qs)[i] == sb {
			hits++
		}
	}
	if hits < len(qs)*2/3 {
		t.Fatalf("standby took over %d of %d queues", hits, len(qs))
	}
}
