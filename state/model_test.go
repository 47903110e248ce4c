package state

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

// TestRandomLayering drives Value and Map through random writes, snapshots,
// commits, aborts and restarts and compares every read with a model: the
// visible state is the model's; after a restart it is the model as of the
// last committed checkpoint.
func TestRandomLayering(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	type model struct {
		vals map[string]int64
		maps map[string]map[int64]int64
	}
	cloneModel := func(m model) model {
		c := model{vals: maps.Clone(m.vals), maps: map[string]map[int64]int64{}}
		for k, v := range m.maps {
			c.maps[k] = maps.Clone(v)
		}
		return c
	}
	cur := model{vals: map[string]int64{}, maps: map[string]map[int64]int64{}}
	committed := cloneModel(cur)
	snaps := map[uint64]model{} // pending snapshots' models
	var inflight []uint64
	var b *Backend
	var v *Value[int64]
	var m *Map[int64, int64]
	open := func() {
		// Small read caches are reset often (by puts past the limit),
		// which drops what they know about the current layer.
		cache := []int64{0, 400, 4096, DefaultReadCacheSize}[rng.IntN(4)]
		b = must(NewBackend(s, "op", 16, WithReadCacheSize(cache)))
		v = must(NewValue(b, "v", VarintCodec()))
		m = must(NewMap(b, "m", Int64Codec(), VarintCodec()))
	}
	open()
	id := uint64(0)
	verify := func() {
		t.Helper()
		for i := range 30 {
			k := fmt.Sprint("k", i)
			b.SetCurrentKey([]byte(k))
			got, ok, err := v.Get()
			want, wok := cur.vals[k]
			if err != nil || ok != wok || got != want {
				t.Fatalf("value %s = %d %v %v, want %d %v", k, got, ok, err, want, wok)
			}
			n := 0
			err = m.Range(func(mk, mv int64) bool {
				n++
				if w, ok := cur.maps[k][mk]; !ok || w != mv {
					t.Fatalf("map %s[%d] = %d, want %d %v", k, mk, mv, w, ok)
				}
				return true
			})
			if err != nil || n != len(cur.maps[k]) {
				t.Fatalf("map %s has %d entries, want %d (%v)", k, n, len(cur.maps[k]), err)
			}
		}
	}
	for step := range 3000 {
		k := fmt.Sprint("k", rng.IntN(30))
		b.SetCurrentKey([]byte(k))
		switch r := rng.IntN(100); {
		case r < 30:
			x := rng.Int64N(1000)
			v.Set(x)
			cur.vals[k] = x
		case r < 35:
			v.Clear()
			delete(cur.vals, k)
		case r < 70:
			mk, mv := rng.Int64N(20)-10, rng.Int64N(1000)
			m.Put(mk, mv)
			if cur.maps[k] == nil {
				cur.maps[k] = map[int64]int64{}
			}
			cur.maps[k][mk] = mv
		case r < 80:
			mk := rng.Int64N(20) - 10
			m.Delete(mk)
			delete(cur.maps[k], mk)
		case r < 83:
			m.Clear()
			delete(cur.maps, k)
		case r < 90:
			id++
			p := b.Snapshot(id)
			snaps[id] = cloneModel(cur)
			inflight = append(inflight, id)
			if rng.IntN(3) == 0 {
				b.Aborted(id)
				break
			}
			if _, err := s.Commit(context.Background(), &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{p}}); err != nil {
				t.Fatal(err)
			}
			if rng.IntN(4) != 0 { // sometimes the notification is late
				b.Committed(id)
			}
			committed = snaps[id]
		case r < 92:
			// Restart: only the committed checkpoint survives.
			s.Close()
			s, err = checkpoint.Open(dir, checkpoint.Options{})
			if err != nil {
				t.Fatal(err)
			}
			open()
			cur = cloneModel(committed)
		default:
			verify()
		}
		if step%500 == 0 {
			verify()
		}
	}
	verify()
}

// TestTimersLenModel drives Timers through random registrations (with
// duplicates), deletions (of present and absent timers), pops, snapshots,
// commits, aborts and restarts, and checks Len of both domains against a
// model after every step: the live timers, and after a restart the timers
// as of the last committed checkpoint.
func TestTimersLenModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	type tk struct {
		d   TimeDomain
		ts  int64
		key string
	}
	cur := map[tk]bool{}
	committed := map[tk]bool{}
	snaps := map[uint64]map[tk]bool{}
	var b *Backend
	var tm *Timers
	open := func() {
		b = must(NewBackend(s, "op", 16, WithKeyGroupRange(0, 16)))
		tm = must(NewTimers(b, "t"))
	}
	open()
	check := func(step int, what string) {
		t.Helper()
		var want [3]int
		for k := range cur {
			want[k.d]++
		}
		for _, d := range []TimeDomain{EventTime, ProcessingTime} {
			if got := tm.Len(d); got != want[d] || got != tm.count(d) {
				t.Fatalf("step %d after %s: Len(%d) = %d, want %d (set holds %d)", step, what, d, got, want[d], tm.count(d))
			}
		}
	}
	id := uint64(0)
	for step := range 4000 {
		d := TimeDomain(1 + rng.IntN(2))
		k := tk{d: d, ts: rng.Int64N(40) - 10, key: fmt.Sprint("k", rng.IntN(20))}
		var what string
		switch r := rng.IntN(100); {
		case r < 45:
			what = "register"
			b.SetCurrentKey([]byte(k.key))
			if err := tm.Register(k.d, k.ts); err != nil {
				t.Fatal(err)
			}
			cur[k] = true
		case r < 65:
			what = "delete"
			b.SetCurrentKey([]byte(k.key))
			if err := tm.Delete(k.d, k.ts); err != nil {
				t.Fatal(err)
			}
			delete(cur, k)
		case r < 80:
			what = "pop"
			upTo := rng.Int64N(40) - 10
			for timer, err := range tm.Due(d, upTo) {
				if err != nil {
					t.Fatal(err)
				}
				pk := tk{d: timer.Domain, ts: timer.Timestamp, key: string(timer.Key)}
				if !cur[pk] || pk.ts > upTo {
					t.Fatalf("step %d: popped %v, not a due live timer", step, pk)
				}
				delete(cur, pk)
			}
			for k := range cur {
				if k.d == d && k.ts <= upTo {
					t.Fatalf("step %d: %v due but not popped", step, k)
				}
			}
		case r < 95:
			what = "snapshot"
			id++
			p := b.Snapshot(id)
			snaps[id] = maps.Clone(cur)
			if rng.IntN(3) == 0 {
				what = "abort"
				b.Aborted(id)
				break
			}
			if _, err := s.Commit(context.Background(), &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{p}}); err != nil {
				t.Fatal(err)
			}
			committed = snaps[id]
			if rng.IntN(4) != 0 { // sometimes the notification is late
				what = "commit"
				b.Committed(id)
			}
		default:
			what = "restart"
			s.Close()
			if s, err = checkpoint.Open(dir, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			open()
			cur = maps.Clone(committed)
		}
		check(step, what)
	}
}
