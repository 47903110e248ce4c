package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/checkpoint"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openStore(t testing.TB, dir string) *checkpoint.Store {
	t.Helper()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newBackend(t testing.TB, s *checkpoint.Store, opts ...BackendOption) *Backend {
	t.Helper()
	b, err := NewBackend(s, "op", DefaultMaxParallelism, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// checkpointNow snapshots b and commits it.
func checkpointNow(t testing.TB, s *checkpoint.Store, b *Backend, id uint64) {
	t.Helper()
	p := b.Snapshot(id)
	if _, err := s.Commit(context.Background(), &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{p}}); err != nil {
		t.Fatal(err)
	}
	b.Committed(id)
}

func TestValueAcrossLayersAndRestore(t *testing.T) {
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, s)
	v := must(NewValue(b, "count", Int64Codec()))
	if _, _, err := v.Get(); !errors.Is(err, ErrNoCurrentKey) {
		t.Fatalf("no key: %v", err)
	}
	for i := range 100 {
		b.SetCurrentKey([]byte(fmt.Sprint("k", i)))
		if err := v.Set(int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	checkpointNow(t, s, b, 1)
	// Change after the checkpoint: must not survive a restart.
	b.SetCurrentKey([]byte("k1"))
	v.Set(1000)
	b.SetCurrentKey([]byte("k2"))
	v.Clear()
	if _, ok, _ := v.Get(); ok {
		t.Fatal("cleared value visible")
	}
	s.Close()

	s = openStore(t, dir)
	b = newBackend(t, s)
	v = must(NewValue(b, "count", Int64Codec()))
	for i := range 100 {
		b.SetCurrentKey([]byte(fmt.Sprint("k", i)))
		got, ok, err := v.Get()
		if err != nil || !ok || got != int64(i) {
			t.Fatalf("k%d = %d %v %v", i, got, ok, err)
		}
	}
	// Keys per key group cover every key exactly once.
	var all []string
	for kg := range DefaultMaxParallelism {
		if err := v.Keys(uint16(kg), func(k []byte) bool {
			if KeyGroup(k, DefaultMaxParallelism) != uint16(kg) {
				t.Fatalf("key %q in key group %d", k, kg)
			}
			all = append(all, string(k))
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(all) != 100 {
		t.Fatalf("Keys found %d keys", len(all))
	}
}

func TestSnapshotCommitAbortLayering(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	v := must(NewValue(b, "v", StringCodec()))
	m := must(NewMap(b, "m", StringCodec(), Int64Codec()))
	b.SetCurrentKey([]byte("a"))
	v.Set("one")
	m.Put("x", 1)
	m.Put("y", 2)
	p1 := b.Snapshot(1)

	// While checkpoint 1 commits asynchronously, reads see the frozen data
	// and new writes go to the current layer.
	var wg sync.WaitGroup
	var commitErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, commitErr = s.Commit(context.Background(), &checkpoint.Commit{ID: 1, Parts: []checkpoint.Part{p1}})
	}()
	if got, ok, _ := v.Get(); !ok || got != "one" {
		t.Fatalf("frozen value: %q %v", got, ok)
	}
	m.Put("z", 3)
	m.Delete("x")
	v.Set("two")
	wg.Wait()
	if commitErr != nil {
		t.Fatal(commitErr)
	}
	b.Committed(1)
	if got, _, _ := v.Get(); got != "two" {
		t.Fatalf("after commit: %q", got)
	}
	stored, ok, _ := s.GetState("op", b.CurrentKeyGroup(), v.h.kbuf[2:])
	if !ok || string(stored) != "one" {
		t.Fatalf("store has %q (current changes leaked?)", stored)
	}

	// Checkpoint 2 fails; its changes stay visible and go with checkpoint 3.
	p2 := b.Snapshot(2)
	_ = p2
	b.Aborted(2)
	if got, _, _ := v.Get(); got != "two" {
		t.Fatalf("after abort: %q", got)
	}
	m.Put("w", 4)
	checkpointNow(t, s, b, 3)
	if b.BufferedBytes() != 0 {
		t.Fatalf("buffered after commit: %d", b.BufferedBytes())
	}
	var got []string
	if err := m.Range(func(k string, v int64) bool { got = append(got, fmt.Sprint(k, v)); return true }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"w4", "y2", "z3"}; !slices.Equal(got, want) {
		t.Fatalf("map after abort+commit = %v, want %v", got, want)
	}
	if got, _, _ := v.Get(); got != "two" {
		t.Fatalf("value from store: %q", got)
	}
}

func TestMapRangeMergesLayers(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	m := must(NewMap(b, "m", Int64Codec(), StringCodec()))
	b.SetCurrentKey([]byte("key"))
	model := map[int64]string{}
	put := func(k int64, v string) { m.Put(k, v); model[k] = v }
	del := func(k int64) { m.Delete(k); delete(model, k) }
	for i := range int64(50) {
		put(i-25, fmt.Sprint("a", i))
	}
	checkpointNow(t, s, b, 1)
	for i := int64(-30); i < 30; i += 3 {
		put(i, fmt.Sprint("b", i))
	}
	del(0)
	b.Snapshot(2) // frozen, never committed
	for i := int64(-10); i < 10; i += 2 {
		del(i)
	}
	put(4, "c")
	check := func() {
		t.Helper()
		var keys []int64
		err := m.Range(func(k int64, v string) bool {
			if model[k] != v {
				t.Fatalf("key %d = %q, want %q", k, v, model[k])
			}
			keys = append(keys, k)
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != len(model) || !slices.IsSorted(keys) {
			t.Fatalf("Range keys %v (want %d, sorted)", keys, len(model))
		}
		for k, v := range model {
			got, ok, err := m.Get(k)
			if err != nil || !ok || got != v {
				t.Fatalf("Get(%d) = %q %v %v", k, got, ok, err)
			}
		}
	}
	check()
	m.Clear()
	clear(model)
	check()
	put(7, "after clear")
	check()
	if ok, _ := m.Contains(7); !ok {
		t.Fatal("Contains after clear+put")
	}
	checkpointNow(t, s, b, 3)
	check()
	// Another key is unaffected by Clear.
	b.SetCurrentKey([]byte("other"))
	if empty, _ := m.IsEmpty(); !empty {
		t.Fatal("other key has entries")
	}
}

func TestListReducingAggregating(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	l := must(NewList(b, "l", StringCodec()))
	r := must(NewReducing(b, "r", Int64Codec(), func(a, b int64) int64 { return a + b }))
	a := must(NewAggregating[float64, avgAcc, float64](b, "a", JSONCodec[avgAcc](), avg{}))
	b.SetCurrentKey([]byte("k"))
	for i := range 5 {
		l.Add(fmt.Sprint(i))
		r.Add(int64(i))
		a.Add(float64(i))
		if i == 2 {
			checkpointNow(t, s, b, 1)
		}
	}
	if got := must(l.Get()); !slices.Equal(got, []string{"0", "1", "2", "3", "4"}) {
		t.Fatalf("list %v", got)
	}
	if got, _, _ := r.Get(); got != 10 {
		t.Fatalf("reducing %d", got)
	}
	if got, _, _ := a.Get(); got != 2 {
		t.Fatalf("aggregating %v", got)
	}
	l.Update([]string{"x"})
	checkpointNow(t, s, b, 2)
	l.Add("y")
	if got := must(l.Get()); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("list after update %v", got)
	}
	l.Clear()
	r.Clear()
	a.Clear()
	if got := must(l.Get()); got != nil {
		t.Fatalf("cleared list %v", got)
	}
	if _, ok, _ := r.Get(); ok {
		t.Fatal("cleared reducing")
	}
	if _, ok, _ := a.Get(); ok {
		t.Fatal("cleared aggregating")
	}
	if c := b.Codecs(); c != "a:aggregating=json:state.avgAcc;l:list=string;r:reducing=int64be" {
		t.Fatalf("Codecs() = %q", c)
	}
	if _, err := NewValue(b, "l", StringCodec()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("duplicate name: %v", err)
	}
}

type avgAcc struct{ Sum, N float64 }
type avg struct{}

func (avg) CreateAccumulator() avgAcc      { return avgAcc{} }
func (avg) Add(a avgAcc, x float64) avgAcc { return avgAcc{a.Sum + x, a.N + 1} }
func (avg) Result(a avgAcc) float64        { return a.Sum / a.N }

func TestTTL(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	v := must(NewValue(b, "v", StringCodec(), WithTTL(time.Minute, clock)))
	m := must(NewMap(b, "m", StringCodec(), StringCodec(), WithTTL(time.Minute, clock)))
	b.SetCurrentKey([]byte("k"))
	v.Set("x")
	m.Put("a", "1")
	now = now.Add(30 * time.Second)
	m.Put("b", "2")
	checkpointNow(t, s, b, 1)
	if got, ok, _ := v.Get(); !ok || got != "x" {
		t.Fatal("value expired early")
	}
	now = now.Add(40 * time.Second) // v and m[a] expired, m[b] not
	if _, ok, _ := v.Get(); ok {
		t.Fatal("expired value visible")
	}
	var keys []string
	m.Range(func(k, _ string) bool { keys = append(keys, k); return true })
	if !slices.Equal(keys, []string{"b"}) {
		t.Fatalf("map after expiry %v", keys)
	}
	// The expired read left a deletion that the next checkpoint persists.
	checkpointNow(t, s, b, 2)
	if _, ok, _ := s.GetState("op", b.CurrentKeyGroup(), v.h.kbuf[2:]); ok {
		t.Fatal("expired value not cleaned from the store")
	}
	// Expired changes are dropped at snapshot.
	b.SetCurrentKey([]byte("k2"))
	v.Set("y")
	now = now.Add(2 * time.Minute)
	checkpointNow(t, s, b, 3)
	if _, ok, _ := s.GetState("op", b.CurrentKeyGroup(), v.h.kbuf[2:]); ok {
		t.Fatal("expired change written at snapshot")
	}
	var seen []string
	v.Keys(b.CurrentKeyGroup(), func(k []byte) bool { seen = append(seen, string(k)); return true })
	if len(seen) != 0 {
		t.Fatalf("Keys lists expired keys %v", seen)
	}
}

func TestTimers(t *testing.T) {
	dir := t.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, s)
	tm := must(NewTimers(b, "timers"))
	reg := func(key string, d TimeDomain, ts int64) {
		b.SetCurrentKey([]byte(key))
		if err := tm.Register(d, ts); err != nil {
			t.Fatal(err)
		}
	}
	reg("a", EventTime, 30)
	reg("b", EventTime, 10)
	reg("c", EventTime, 20)
	reg("c", EventTime, 20) // duplicate
	reg("a", EventTime, -5)
	reg("a", ProcessingTime, 15)
	reg("d", EventTime, 40)
	b.SetCurrentKey([]byte("d"))
	tm.Delete(EventTime, 40)
	if n := tm.Len(EventTime); n != 4 {
		t.Fatalf("Len = %d", n)
	}
	if ts, ok := tm.NextTimestamp(EventTime); !ok || ts != -5 {
		t.Fatalf("NextTimestamp = %d %v", ts, ok)
	}
	checkpointNow(t, s, b, 1)
	reg("e", EventTime, 25) // after the checkpoint: lost on restart
	s.Close()

	s = openStore(t, dir)
	b = newBackend(t, s)
	tm = must(NewTimers(b, "timers"))
	var got []string
	for timer, err := range tm.Due(EventTime, 25) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprint(string(timer.Key), timer.Timestamp))
		if string(timer.Key) == "b" && timer.Timestamp == 10 {
			b.SetCurrentKey(timer.Key)
			tm.Register(EventTime, 22) // registered while firing, due
			tm.Register(EventTime, 99) // not due
		}
	}
	if want := []string{"a-5", "b10", "c20", "b22"}; !slices.Equal(got, want) {
		t.Fatalf("due = %v, want %v", got, want)
	}
	if ts, _ := tm.NextTimestamp(EventTime); ts != 30 {
		t.Fatalf("next = %d", ts)
	}
	if ts, _ := tm.NextTimestamp(ProcessingTime); ts != 15 {
		t.Fatalf("next processing = %d", ts)
	}
	checkpointNow(t, s, b, 2)
	b2 := newBackend(t, s)
	tm2 := must(NewTimers(b2, "timers"))
	if tm2.Len(EventTime) != 2 || tm2.Len(ProcessingTime) != 1 {
		t.Fatalf("reloaded %d/%d timers", tm2.Len(EventTime), tm2.Len(ProcessingTime))
	}
}

func TestKeyGroups(t *testing.T) {
	counts := make([]int, DefaultMaxParallelism)
	for i := range 100000 {
		counts[KeyGroup([]byte(fmt.Sprint("key-", i)), DefaultMaxParallelism)]++
	}
	for kg, n := range counts {
		if n < 600 || n > 1000 {
			t.Fatalf("key group %d has %d of 100000 keys", kg, n)
		}
	}
	// Stable: part of the durable format.
	if got := KeyGroup([]byte("hello"), 128); got != KeyGroup([]byte("hello"), 128) {
		t.Fatal("unstable")
	}
	for _, par := range []int{1, 3, 7, 128} {
		next := uint16(0)
		for st := range par {
			s, e := KeyGroupRange(128, par, st)
			if s != next {
				t.Fatalf("par %d subtask %d starts at %d, want %d", par, st, s, next)
			}
			for kg := s; kg < e; kg++ {
				if SubtaskOf(kg, 128, par) != st {
					t.Fatalf("par %d kg %d owner %d, want %d", par, kg, SubtaskOf(kg, 128, par), st)
				}
			}
			next = e
		}
		if next != 128 {
			t.Fatalf("par %d covers %d key groups", par, next)
		}
	}
}

func TestCodecsRejectBadInput(t *testing.T) {
	if _, err := Int64Codec().Decode([]byte{1}); !errors.Is(err, ErrDecode) {
		t.Fatal(err)
	}
	if _, err := VarintCodec().Decode([]byte{0x80}); !errors.Is(err, ErrDecode) {
		t.Fatal(err)
	}
	if _, err := JSONCodec[avgAcc]().Decode([]byte("{")); !errors.Is(err, ErrDecode) {
		t.Fatal(err)
	}
	for _, x := range []int64{-1 << 63, -5, 0, 7, 1<<63 - 1} {
		b, _ := Int64Codec().Append(nil, x)
		if y, _ := Int64Codec().Decode(b); y != x {
			t.Fatal(x)
		}
	}
}

// TestLayerIndex checks a layer's key index against a map through inserts
// (growing the table several times), overwrites, range deletions (deleted
// slots) and reuse.
func TestLayerIndex(t *testing.T) {
	l := newLayer(0)
	for round := range 3 {
		want := map[string][]byte{}
		key := func(i int) []byte { return []byte(fmt.Sprintf("\x00\x01k%06d", i)) }
		for i := range 5000 {
			v := []byte(fmt.Sprint(i, round))
			l.put(key(i), v)
			want[string(key(i))] = v
		}
		for i := 0; i < 5000; i += 3 {
			v := []byte(fmt.Sprint("again", i))
			l.put(key(i), v)
			want[string(key(i))] = v
		}
		// Delete [1000, 3000), then put half of it back.
		l.deleteRange(key(1000), key(3000))
		for i := 1000; i < 3000; i++ {
			delete(want, string(key(i)))
		}
		for i := 1000; i < 3000; i += 2 {
			v := []byte(fmt.Sprint("back", i))
			l.put(key(i), v)
			want[string(key(i))] = v
		}
		for i := range 6000 {
			e, masked := l.lookup(key(i))
			w, ok := want[string(key(i))]
			switch {
			case ok && (e == nil || e.del || string(e.val) != string(w)):
				t.Fatalf("round %d: key %d: got %+v, want %q", round, i, e, w)
			case !ok && e != nil:
				t.Fatalf("round %d: key %d: got %+v, want none", round, i, e)
			case !ok && i >= 1000 && i < 3000 && !masked:
				t.Fatalf("round %d: key %d: not masked by the range deletion", round, i)
			}
		}
		if l.index.len() != len(want) {
			t.Fatalf("round %d: index holds %d keys, want %d", round, l.index.len(), len(want))
		}
		l.reuse()
		if e, _ := l.lookup(key(1)); e != nil || l.index.len() != 0 {
			t.Fatalf("round %d: reused layer still has entries", round)
		}
	}
}
