package state

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

// timerRef is a timer of the reference model.
type timerRef struct {
	d   TimeDomain
	ts  int64
	key string
}

// firingOrder is the documented order of due timers: timestamp, then key
// group, then key.
func firingOrder(maxP int) func(a, b timerRef) int {
	return func(a, b timerRef) int {
		if c := cmp.Compare(a.ts, b.ts); c != 0 {
			return c
		}
		if c := cmp.Compare(KeyGroup([]byte(a.key), maxP), KeyGroup([]byte(b.key), maxP)); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	}
}

// TestTimersOrderModel drives Timers through random registrations (many at
// the same timestamps, with duplicates), deletions, re-registrations,
// Has, pops (some cut short, some registering and deleting timers while
// they fire), snapshots, commits and restarts, against a model: every
// popped timer must be the first live due timer in firing order, Has must
// agree, and after a restart the timers are those of the last committed
// checkpoint. Bulk steps register and delete hundreds of keys at one
// timestamp so that buckets are sorted and compacted.
func TestTimersOrderModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	const maxP = 8
	order := firingOrder(maxP)
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	live := map[timerRef]bool{}
	committed := map[timerRef]bool{}
	var b *Backend
	var tm *Timers
	open := func() {
		b = must(NewBackend(s, "op", maxP))
		tm = must(NewTimers(b, "t"))
	}
	open()
	randRef := func(keys int) timerRef {
		return timerRef{
			d:   TimeDomain(1 + rng.IntN(2)),
			ts:  int64(rng.IntN(6)) * 10, // few timestamps: many ties
			key: fmt.Sprint("k", rng.IntN(keys)),
		}
	}
	register := func(r timerRef) {
		b.SetCurrentKey([]byte(r.key))
		if err := tm.Register(r.d, r.ts); err != nil {
			t.Fatal(err)
		}
		live[r] = true
	}
	del := func(r timerRef) {
		b.SetCurrentKey([]byte(r.key))
		if err := tm.Delete(r.d, r.ts); err != nil {
			t.Fatal(err)
		}
		delete(live, r)
	}
	// firstDue is the model's next timer of d due at upTo.
	firstDue := func(d TimeDomain, upTo int64) (timerRef, bool) {
		var best timerRef
		found := false
		for r := range live {
			if r.d == d && r.ts <= upTo && (!found || order(r, best) < 0) {
				best, found = r, true
			}
		}
		return best, found
	}
	id := uint64(0)
	pops := 0
	for step := range 2000 {
		switch x := rng.IntN(100); {
		case x < 38:
			register(randRef(40))
		case x < 53:
			del(randRef(40))
		case x < 58:
			// Bulk: many keys at one time, then most of them deleted and
			// some registered again.
			r := randRef(1)
			n := 100 + rng.IntN(200)
			for i := range n {
				register(timerRef{d: r.d, ts: r.ts, key: fmt.Sprint("b", i)})
			}
			for i := range n {
				if rng.IntN(10) < 8 {
					del(timerRef{d: r.d, ts: r.ts, key: fmt.Sprint("b", i)})
				}
			}
			for range n / 4 {
				register(timerRef{d: r.d, ts: r.ts, key: fmt.Sprint("b", rng.IntN(n))})
			}
		case x < 68:
			r := randRef(40)
			b.SetCurrentKey([]byte(r.key))
			if got := tm.Has(r.d, r.ts); got != live[r] {
				t.Fatalf("step %d: Has(%v) = %v, want %v", step, r, got, live[r])
			}
		case x < 92:
			d := TimeDomain(1 + rng.IntN(2))
			upTo := int64(rng.IntN(7))*10 - 5
			stopAfter := -1
			if rng.IntN(4) == 0 {
				stopAfter = rng.IntN(5)
			}
			n := 0
			for timer, err := range tm.Due(d, upTo) {
				if err != nil {
					t.Fatal(err)
				}
				got := timerRef{d: timer.Domain, ts: timer.Timestamp, key: string(timer.Key)}
				want, ok := firstDue(d, upTo)
				if !ok || got != want {
					t.Fatalf("step %d: popped %v, want %v (%v)", step, got, want, ok)
				}
				if timer.KeyGroup != KeyGroup(timer.Key, maxP) {
					t.Fatalf("step %d: key group %d of %v", step, timer.KeyGroup, got)
				}
				delete(live, got)
				pops++
				// While firing: timers at this time, earlier, later; a
				// deletion.
				switch rng.IntN(6) {
				case 0:
					register(timerRef{d: d, ts: got.ts, key: fmt.Sprint("k", rng.IntN(40))})
				case 1:
					register(timerRef{d: d, ts: got.ts - 1 - int64(rng.IntN(10)), key: fmt.Sprint("k", rng.IntN(40))})
				case 2:
					register(randRef(40))
				case 3:
					del(randRef(40))
				}
				n++
				if n == stopAfter {
					break
				}
			}
			if stopAfter < 0 || n < stopAfter {
				if r, ok := firstDue(d, upTo); ok {
					t.Fatalf("step %d: %v due but not popped", step, r)
				}
			}
		case x < 98:
			id++
			p := b.Snapshot(id)
			snap := maps.Clone(live)
			if _, err := s.Commit(context.Background(), &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{p}}); err != nil {
				t.Fatal(err)
			}
			committed = snap
			b.Committed(id)
		default:
			s.Close()
			if s, err = checkpoint.Open(dir, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			open()
			live = maps.Clone(committed)
		}
		for _, d := range []TimeDomain{EventTime, ProcessingTime} {
			want := 0
			var next timerRef
			for r := range live {
				if r.d == d {
					if want == 0 || r.ts < next.ts {
						next = r
					}
					want++
				}
			}
			if step%10 == 0 {
				tm.check(d)
			}
			if got := tm.Len(d); got != want {
				t.Fatalf("step %d: Len(%d) = %d, want %d", step, d, got, want)
			}
			ts, ok := tm.NextTimestamp(d)
			if ok != (want > 0) || ok && ts != next.ts {
				t.Fatalf("step %d: NextTimestamp(%d) = %d %v, want %d", step, d, ts, ok, next.ts)
			}
		}
	}
	if pops < 500 {
		t.Fatalf("only %d timers popped", pops)
	}
}

// TestTimersBucketBounded registers and deletes the same timers at one
// timestamp many times: the bucket's keys stay bounded by its live timers.
func TestTimersBucketBounded(t *testing.T) {
	b := newBackend(t, openStore(t, t.TempDir()))
	tm := must(NewTimers(b, "t"))
	keys := benchKeys(10)
	for range 1000 {
		for _, k := range keys {
			b.SetCurrentKey(k)
			if err := tm.Register(EventTime, 100); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys[1:] {
			b.SetCurrentKey(k)
			if err := tm.Delete(EventTime, 100); err != nil {
				t.Fatal(err)
			}
		}
	}
	bk := tm.q[EventTime].buckets[100]
	if bk == nil || bk.live != 1 || len(bk.keys) > 2*64+len(keys) {
		t.Fatalf("bucket %+v", bk)
	}
	n := 0
	for timer, err := range tm.Due(EventTime, 100) {
		if err != nil || string(timer.Key) != string(keys[0]) {
			t.Fatalf("popped %q %v", timer.Key, err)
		}
		n++
	}
	if n != 1 || tm.Len(EventTime) != 0 || len(tm.q[EventTime].heap) != 0 {
		t.Fatalf("popped %d, %d left", n, tm.Len(EventTime))
	}
}

// TestTimersPendingUntilSnapshot checks the pending timers (registered
// since the last Snapshot, kept out of the layer until it): one registered
// and removed within an interval writes nothing; a committed one deleted
// and registered again within one interval (its deletion is in the layer)
// survives the checkpoint, as does one fired and registered again; churn
// on the same timer between Snapshots keeps the pending list bounded.
func TestTimersPendingUntilSnapshot(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	b := newBackend(t, s)
	tm := must(NewTimers(b, "t"))
	reg := func(key string, ts int64) {
		t.Helper()
		b.SetCurrentKey([]byte(key))
		if err := tm.Register(EventTime, ts); err != nil {
			t.Fatal(err)
		}
	}
	del := func(key string, ts int64) {
		t.Helper()
		b.SetCurrentKey([]byte(key))
		if err := tm.Delete(EventTime, ts); err != nil {
			t.Fatal(err)
		}
	}
	reg("a", 10)
	reg("b", 10)
	reg("c", 20)
	if n := b.cur.ents.len(); n != 0 {
		t.Fatalf("%d layer entries before the snapshot, want 0", n)
	}
	del("c", 20) // pending: nothing to write
	keys, commit := partKeys(t, b, 1)
	commit()
	if len(keys) != 2 {
		t.Fatalf("checkpoint 1 wrote %v, want the puts of a and b", keys)
	}
	// a: committed, deleted and registered again. b: committed, fired and
	// registered again. c: registered and fired in the interval.
	del("a", 10)
	reg("a", 10)
	reg("c", 30)
	n, again := 0, false
	for timer, err := range tm.Due(EventTime, 10) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if string(timer.Key) == "b" && !again {
			again = true
			reg("b", 10) // at the time being fired: pops again
		}
	}
	if n != 3 {
		t.Fatalf("popped %d timers at 10, want 3 (a, b, b again)", n)
	}
	reg("a", 10) // fired (a deletion in the layer), registered again
	reg("b", 10)
	reg("d", 60) // pending at the snapshot
	// Churn: the same timer registered and deleted many times.
	for range 10_000 {
		reg("z", 50)
		del("z", 50)
	}
	if len(tm.added) > 3000 {
		t.Fatalf("%d pending keys after churn on one timer", len(tm.added))
	}
	want := map[string]bool{}
	for k := range tm.set {
		want[fmt.Sprint(decodeTS(unsafeSlice(k)[2+len(tm.h.prefix)+1:]), string(unsafeSlice(k)[2+len(tm.h.prefix)+9:]))] = true
	}
	checkpointNow(t, s, b, 2)
	s.Close()

	s = openStore(t, dir)
	b = newBackend(t, s)
	tm = must(NewTimers(b, "t"))
	got := map[string]bool{}
	for timer, err := range tm.Due(EventTime, 100) {
		if err != nil {
			t.Fatal(err)
		}
		got[fmt.Sprint(timer.Timestamp, string(timer.Key))] = true
	}
	if !maps.Equal(got, want) || len(want) < 3 {
		t.Fatalf("restored timers %v, want %v", got, want)
	}
}

// TestGroupTimers: a key group's timers need no current key, are unique
// per key group and time, pop in time order (then key group) with an
// empty key, stay apart from a key's timers (also of an empty key), and
// are checkpointed and restored like them.
func TestGroupTimers(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	b := newBackend(t, s, WithKeyGroupRange(0, 64))
	tm := must(NewTimers(b, "t"))
	for _, g := range []struct {
		kg uint16
		ts int64
	}{{3, 20}, {1, 20}, {3, 10}, {3, 20}, {5, 30}} {
		if err := tm.RegisterGroup(g.kg, g.ts); err != nil {
			t.Fatal(err)
		}
	}
	if err := tm.RegisterGroup(64, 10); err == nil {
		t.Fatal("RegisterGroup outside the backend's key groups: no error")
	}
	b.SetCurrentKey(nil) // a key's timer with an empty key: another timer
	kg0 := b.CurrentKeyGroup()
	if err := tm.Register(EventTime, 20); err != nil {
		t.Fatal(err)
	}
	if n := tm.Len(GroupEventTime); n != 4 {
		t.Fatalf("%d group timers, want 4 (one duplicate)", n)
	}
	if !tm.HasGroup(3, 10) || tm.HasGroup(2, 10) || tm.HasGroup(3, 30) {
		t.Fatal("HasGroup disagrees with the registrations")
	}
	if !tm.Has(EventTime, 20) || tm.Len(EventTime) != 1 {
		t.Fatal("the key's timer is missing or counted with the group timers")
	}
	checkpointNow(t, s, b, 1)
	s.Close()

	s = openStore(t, dir)
	b = newBackend(t, s, WithKeyGroupRange(0, 64))
	tm = must(NewTimers(b, "t"))
	var got []string
	for timer, err := range tm.Due(GroupEventTime, 25) {
		if err != nil {
			t.Fatal(err)
		}
		if len(timer.Key) != 0 || timer.Domain != GroupEventTime {
			t.Fatalf("group timer %+v has a key or another domain", timer)
		}
		got = append(got, fmt.Sprint(timer.KeyGroup, "@", timer.Timestamp))
	}
	if fmt.Sprint(got) != "[3@10 1@20 3@20]" {
		t.Fatalf("restored group timers due by 25: %v, want [3@10 1@20 3@20]", got)
	}
	if !tm.HasGroup(5, 30) || tm.Len(GroupEventTime) != 1 {
		t.Fatal("the group timer at 30 was not restored, or others were left")
	}
	tm2, ok, err := tm.PopDue(EventTime, 25)
	if err != nil || !ok || len(tm2.Key) != 0 || tm2.KeyGroup != kg0 {
		t.Fatalf("the empty key's timer after the restore: %+v %v %v", tm2, ok, err)
	}
}

// TestMapEntries: Entries lists every key's map entries of a key group,
// from the layers merged over the store (deleted ones left out).
func TestMapEntries(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	m := must(NewMap(b, "m", Int64Codec(), StringCodec()))
	keys := map[uint16][]string{}
	put := func(key string, k int64) {
		b.SetCurrentKey([]byte(key))
		if err := m.Put(k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		key := fmt.Sprint("key", i)
		put(key, int64(i))
		put(key, int64(-i-1))
	}
	checkpointNow(t, s, b, 1)
	for i := range 50 {
		key := fmt.Sprint("key", i)
		if i%2 == 0 {
			b.SetCurrentKey([]byte(key))
			if err := m.Delete(int64(-i - 1)); err != nil {
				t.Fatal(err)
			}
		}
		put(key, 1000+int64(i)) // in the current layer only
	}
	for i := range 50 {
		key := fmt.Sprint("key", i)
		kg := KeyGroup([]byte(key), DefaultMaxParallelism)
		keys[kg] = append(keys[kg], fmt.Sprint(key, ":", i), fmt.Sprint(key, ":", 1000+i))
		if i%2 != 0 {
			keys[kg] = append(keys[kg], fmt.Sprint(key, ":", -i-1))
		}
	}
	for kg := range uint16(DefaultMaxParallelism) {
		var got []string
		err := m.Entries(kg, func(key []byte, k int64) (bool, error) {
			got = append(got, fmt.Sprint(string(key), ":", k))
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := keys[kg]
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("key group %d: entries %v, want %v", kg, got, want)
		}
	}
}
