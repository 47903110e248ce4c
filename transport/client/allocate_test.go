package client

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func allocTestQueues(topic string, brokers, perBroker int) []protocol.MessageQueue {
	var qs []protocol.MessageQueue
	for b := range brokers {
		for i := range perBroker {
			qs = append(qs, protocol.MessageQueue{Topic: topic, BrokerName: "broker-" + string(rune('a'+b)), QueueID: int32(i)})
		}
	}
	slices.SortFunc(qs, protocol.MessageQueue.Compare)
	return qs
}

func allocTestMembers(ids ...int) []string {
	var ms []string
	for _, id := range ids {
		ms = append(ms, fmt.Sprintf("10.0.0.%d@%d", id%250, 1000+id))
	}
	slices.Sort(ms)
	return slices.Compact(ms)
}

// allocShares returns every member's allocation.
func allocShares(a Allocator, members []string, queues []protocol.MessageQueue) map[string][]protocol.MessageQueue {
	out := make(map[string][]protocol.MessageQueue, len(members))
	for _, m := range members {
		out[m] = a.Allocate(m, members, queues)
	}
	return out
}

// allocCheckPartition fails unless the shares are a partition of queues.
func allocCheckPartition(t *testing.T, name string, sh map[string][]protocol.MessageQueue, queues []protocol.MessageQueue) {
	t.Helper()
	owner := make(map[protocol.MessageQueue]string)
	for m, qs := range sh {
		for _, q := range qs {
			if !slices.Contains(queues, q) {
				t.Fatalf("%s: %s got unknown queue %s", name, m, q)
			}
			if o, dup := owner[q]; dup {
				t.Fatalf("%s: queue %s owned by %s and %s", name, q, o, m)
			}
			owner[q] = m
		}
	}
	if len(owner) != len(queues) {
		t.Fatalf("%s: %d of %d queues allocated", name, len(owner), len(queues))
	}
}

func allocTestAllocators() map[string]Allocator {
	return map[string]Allocator{
		"averagely":       AllocateAveragely(),
		"circle":          AllocateAveragelyByCircle(),
		"consistent-hash": AllocateConsistentHash(0),
		"consistent-1":    AllocateConsistentHash(1),
		"consistent-64":   AllocateConsistentHash(64),
	}
}

func TestAllocatePartitionRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for iter := range 150 {
		var ids []int
		for range 1 + r.IntN(12) {
			ids = append(ids, r.IntN(1000))
		}
		members := allocTestMembers(ids...)
		queues := allocTestQueues("t"+strconv.Itoa(iter%3), 1+r.IntN(3), r.IntN(17))
		for name, a := range allocTestAllocators() {
			sh := allocShares(a, members, queues)
			allocCheckPartition(t, fmt.Sprintf("%s iter %d (%d members, %d queues)", name, iter, len(members), len(queues)), sh, queues)
			// Deterministic: a second run over copies gives the same allocShares.
			again := allocShares(a, slices.Clone(members), slices.Clone(queues))
			for m := range sh {
				if !slices.Equal(sh[m], again[m]) {
					t.Fatalf("%s: not deterministic for %s: %v vs %v", name, m, sh[m], again[m])
				}
			}
			if got := a.Allocate("not-a-member@1", members, queues); len(got) != 0 {
				t.Fatalf("%s: non-member got %v", name, got)
			}
			if name == "averagely" || name == "circle" {
				lo, hi := len(queues), 0
				for _, qs := range sh {
					lo, hi = min(lo, len(qs)), max(hi, len(qs))
				}
				if hi-lo > 1 {
					t.Fatalf("%s: uneven allocShares %d..%d", name, lo, hi)
				}
			}
		}
	}
}

// The shapes RocketMQ documents for its averagely strategies.
func TestAllocateAveragelyShapes(t *testing.T) {
	q := allocTestQueues("t", 1, 8)
	m := allocTestMembers(1, 2, 3)
	want := map[string][]int32{m[0]: {0, 1, 2}, m[1]: {3, 4, 5}, m[2]: {6, 7}}
	wantCircle := map[string][]int32{m[0]: {0, 3, 6}, m[1]: {1, 4, 7}, m[2]: {2, 5}}
	ids := func(qs []protocol.MessageQueue) []int32 {
		var out []int32
		for _, q := range qs {
			out = append(out, q.QueueID)
		}
		return out
	}
	for _, id := range m {
		if got := ids(AllocateAveragely().Allocate(id, m, q)); !slices.Equal(got, want[id]) {
			t.Errorf("averagely %s = %v, want %v", id, got, want[id])
		}
		if got := ids(AllocateAveragelyByCircle().Allocate(id, m, q)); !slices.Equal(got, wantCircle[id]) {
			t.Errorf("circle %s = %v, want %v", id, got, wantCircle[id])
		}
	}
	// 10 queues over 4 members: 3,3,2,2 contiguous.
	q = allocTestQueues("t", 1, 10)
	m = allocTestMembers(1, 2, 3, 4)
	wantSizes := []int{3, 3, 2, 2}
	next := int32(0)
	for i, id := range m {
		got := ids(AllocateAveragely().Allocate(id, m, q))
		if len(got) != wantSizes[i] {
			t.Fatalf("member %d got %v", i, got)
		}
		for _, g := range got {
			if g != next {
				t.Fatalf("member %d got %v, not contiguous from %d", i, got, next)
			}
			next++
		}
	}
	// More members than queues: the first n get one each, the rest nothing.
	q = allocTestQueues("t", 1, 3)
	m = allocTestMembers(1, 2, 3, 4, 5)
	for i, id := range m {
		got := ids(AllocateAveragely().Allocate(id, m, q))
		if i < 3 && !slices.Equal(got, []int32{int32(i)}) || i >= 3 && len(got) != 0 {
			t.Errorf("member %d of 5 over 3 queues got %v", i, got)
		}
	}
	// Two brokers: blocks follow the sorted order (broker, queue).
	q = allocTestQueues("t", 2, 4)
	m = allocTestMembers(1, 2)
	if got := AllocateAveragely().Allocate(m[0], m, q); got[0].BrokerName != "broker-a" || got[3] != (protocol.MessageQueue{Topic: "t", BrokerName: "broker-a", QueueID: 3}) {
		t.Errorf("two brokers: first member got %v", got)
	}
}

func TestAllocateConsistentHashMovement(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	a := AllocateConsistentHash(0)
	for iter := range 100 {
		var ids []int
		for range 1 + r.IntN(8) {
			ids = append(ids, r.IntN(1000))
		}
		before := allocTestMembers(ids...)
		queues := allocTestQueues("topic-"+strconv.Itoa(iter), 1+r.IntN(2), 1+r.IntN(32))
		old := allocShares(a, before, queues)
		owner := func(sh map[string][]protocol.MessageQueue) map[protocol.MessageQueue]string {
			o := make(map[protocol.MessageQueue]string)
			for m, qs := range sh {
				for _, q := range qs {
					o[q] = m
				}
			}
			return o
		}
		oldOwner := owner(old)
		// Join: a queue either keeps its owner or moves to the newcomer.
		joiner := fmt.Sprintf("10.1.1.1@%d", 5000+iter)
		after := append(slices.Clone(before), joiner)
		slices.Sort(after)
		newOwner := owner(allocShares(a, after, queues))
		for q, o := range newOwner {
			if o != oldOwner[q] && o != joiner {
				t.Fatalf("join: %s moved from %s to %s (not the joiner)", q, oldOwner[q], o)
			}
		}
		// Leave: only the leaver's queues move.
		if len(before) < 2 {
			continue
		}
		leaver := before[r.IntN(len(before))]
		rest := slices.DeleteFunc(slices.Clone(before), func(m string) bool { return m == leaver })
		newOwner = owner(allocShares(a, rest, queues))
		for q, o := range newOwner {
			if oldOwner[q] != leaver && o != oldOwner[q] {
				t.Fatalf("leave: %s moved from %s to %s though %s left", q, oldOwner[q], o, leaver)
			}
		}
	}
}

func TestAllocateByConfig(t *testing.T) {
	all := allocTestQueues("t", 2, 4)
	mine := []protocol.MessageQueue{all[5], all[1], all[1], {Topic: "t", BrokerName: "broker-z", QueueID: 0}}
	got := AllocateByConfig(mine...).Allocate("anyone", nil, all)
	if want := []protocol.MessageQueue{all[1], all[5]}; !slices.Equal(got, want) {
		t.Fatalf("by config = %v, want %v", got, want)
	}
	mine[0] = all[0] // the allocator keeps its own copy
	if got2 := AllocateByConfig().Allocate("x", nil, all); len(got2) != 0 {
		t.Fatalf("empty config got %v", got2)
	}
	if got3 := AllocateByConfig(mine[1]).Allocate("x", nil, all); !slices.Equal(got3, []protocol.MessageQueue{all[1]}) {
		t.Fatalf("got %v", got3)
	}
}

func BenchmarkAllocate(b *testing.B) {
	members := allocTestMembers(1, 2, 3, 4, 5, 6, 7, 8)
	queues := allocTestQueues("t", 4, 16)
	for name, a := range map[string]Allocator{
		"averagely":       AllocateAveragely(),
		"circle":          AllocateAveragelyByCircle(),
		"consistent-hash": AllocateConsistentHash(0),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = a.Allocate(members[3], members, queues)
			}
		})
	}
}
