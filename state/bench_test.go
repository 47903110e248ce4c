package state

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/testutil/cputime"
)

func benchKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("user-%08d", i))
	}
	return keys
}

// BenchmarkValueGetSet is the keyed-count hot path: SetCurrentKey, Get, Set
// on 10k keys in the write-back layer.
func BenchmarkValueGetSet(b *testing.B) {
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	v := must(NewValue(be, "count", Int64Codec()))
	keys := benchKeys(10000)
	for _, k := range keys {
		be.SetCurrentKey(k)
		v.Set(0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		be.SetCurrentKey(keys[i%len(keys)])
		n, _, err := v.Get()
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Set(n + 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValueGetCommitted reads values that are only in the store.
func BenchmarkValueGetCommitted(b *testing.B) {
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	v := must(NewValue(be, "count", Int64Codec()))
	keys := benchKeys(10000)
	for _, k := range keys {
		be.SetCurrentKey(k)
		v.Set(1)
	}
	checkpointNow(b, s, be, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		be.SetCurrentKey(keys[i%len(keys)])
		if _, ok, err := v.Get(); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

func BenchmarkMapPut(b *testing.B) {
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	m := must(NewMap(be, "m", Int64Codec(), Int64Codec()))
	keys := benchKeys(1000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		be.SetCurrentKey(keys[i%len(keys)])
		if err := m.Put(int64(i%64), int64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotCommit measures Snapshot + Commit (one synced batch) +
// Committed of n changed keys and reports the p50/p99 latency of the three
// in sequence, and the p99 of: durable (Snapshot + Commit: until the
// checkpoint is on disk), stall (Snapshot + Committed: the time the
// subtask's goroutine spends; a pipeline runs Commit on its coordinator
// while the subtask processes), and the parts: build (the part's sorted
// batch writes), pebble (the rest of Commit: metadata, memtable rotation,
// WAL write and fsync, memtable insert) and committed (dropping the layer
// into the read cache). On a shared machine the wall times vary with the
// load; cpu-p50-ms (this goroutine's thread CPU for the three calls, which
// leaves out the WAL's sync on Pebble's own goroutine) and cpu-ms/op (the
// process's CPU per iteration, setting the keys and Pebble's background
// flushes and compactions included) vary far less.
//
// "100000-rotate" runs with checkpoint.Options.RotateMemTableAt: each
// commit goes into a fresh memtable (less work in the commit, a flush per
// checkpoint in the background).
func BenchmarkSnapshotCommit(b *testing.B) {
	for _, c := range []struct {
		n      int
		rotate bool
	}{{10000, false}, {100000, false}, {100000, true}} {
		name := fmt.Sprint(c.n)
		if c.rotate {
			name += "-rotate"
		}
		b.Run(name, func(b *testing.B) {
			n := c.n
			opts := checkpoint.Options{}
			if c.rotate {
				opts.RotateMemTableAt = checkpoint.RecommendedRotateMemTableAt
			}
			s, err := checkpoint.Open(b.TempDir(), opts)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			be := newBackend(b, s)
			v := must(NewValue(be, "count", Int64Codec()))
			keys := benchKeys(n)
			var lat, durable, stall, build, pebble, committed, cpu []time.Duration
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cputime.Process()
			for i := range b.N {
				b.StopTimer()
				for _, k := range keys {
					be.SetCurrentKey(k)
					v.Set(int64(i))
				}
				b.StartTimer()
				start, cpuStart := time.Now(), threadCPU()
				p := &timedPart{p: be.Snapshot(uint64(i + 1)).(checkpoint.PartSizer)}
				snap := time.Now()
				if _, err := s.Commit(context.Background(), &checkpoint.Commit{ID: uint64(i + 1), Parts: []checkpoint.Part{p}}); err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				be.Committed(uint64(i + 1))
				end := time.Now()
				cpu = append(cpu, threadCPU()-cpuStart)
				lat = append(lat, end.Sub(start))
				durable = append(durable, mid.Sub(start))
				stall = append(stall, snap.Sub(start)+end.Sub(mid))
				build = append(build, p.took)
				pebble = append(pebble, mid.Sub(start)-p.took)
				committed = append(committed, end.Sub(mid))
			}
			b.StopTimer()
			b.ReportMetric(float64((cputime.Process()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			p := func(d []time.Duration, q int) float64 {
				slices.Sort(d)
				return float64(d[len(d)*q/100].Microseconds()) / 1000
			}
			b.ReportMetric(p(lat, 50), "p50-ms")
			b.ReportMetric(p(lat, 99), "p99-ms")
			b.ReportMetric(p(cpu, 50), "cpu-p50-ms")
			b.ReportMetric(p(durable, 99), "durable-p99-ms")
			b.ReportMetric(p(stall, 99), "stall-p99-ms")
			b.ReportMetric(p(build, 99), "build-p99-ms")
			b.ReportMetric(p(pebble, 99), "pebble-p99-ms")
			b.ReportMetric(p(committed, 99), "committed-p99-ms")
		})
	}
}

// timedPart times its part's WriteTo.
type timedPart struct {
	p    checkpoint.PartSizer
	took time.Duration
}

func (t *timedPart) SizeHint() int { return t.p.SizeHint() }

func (t *timedPart) WriteTo(w *checkpoint.Writer) error {
	start := time.Now()
	err := t.p.WriteTo(w)
	t.took = time.Since(start)
	return err
}

// BenchmarkRestart1M measures reopening a store holding 1M keys of state and
// reading the first key (restart-to-first-read: no scan at open).
func BenchmarkRestart1M(b *testing.B) {
	dir := b.TempDir()
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		b.Fatal(err)
	}
	be := newBackend(b, s)
	v := must(NewValue(be, "count", Int64Codec()))
	keys := benchKeys(1_000_000)
	for i, k := range keys {
		be.SetCurrentKey(k)
		v.Set(int64(i))
		if (i+1)%250000 == 0 {
			checkpointNow(b, s, be, uint64(i+1))
		}
	}
	s.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s, err := checkpoint.Open(dir, checkpoint.Options{})
		if err != nil {
			b.Fatal(err)
		}
		be := must(NewBackend(s, "op", DefaultMaxParallelism))
		v := must(NewValue(be, "count", Int64Codec()))
		be.SetCurrentKey(keys[len(keys)/2])
		if x, ok, err := v.Get(); err != nil || !ok || x != int64(len(keys)/2) {
			b.Fatal(x, ok, err)
		}
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
}

// BenchmarkValueCountCheckpointed is the keyed count of the end-to-end
// benchmark on one subtask: 100k int64 keys in a scattered order, Get then
// Set per record, a checkpoint (snapshot, commit, Committed; not timed)
// every 200k records, so each key is read once per checkpoint from what the
// previous checkpoint left.
func BenchmarkValueCountCheckpointed(b *testing.B) {
	const keys, every = 100_000, 200_000
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	v := must(NewValue(be, "count", Int64Codec()))
	kbuf := make([]byte, 0, 8)
	id := uint64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%every == 0 {
			b.StopTimer()
			id++
			checkpointNow(b, s, be, id)
			b.StartTimer()
		}
		kbuf, _ = Int64Codec().Append(kbuf[:0], int64((uint64(i)*7919)%keys))
		be.SetCurrentKey(kbuf)
		n, _, err := v.Get()
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Set(n + 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTimersLen is the keyed task's per-message question "any
// processing-time timers?" with 100k event-time timers registered: it must
// not depend on the number of timers.
func BenchmarkTimersLen(b *testing.B) {
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	tm := must(NewTimers(be, "t"))
	for _, k := range benchKeys(100_000) {
		be.SetCurrentKey(k)
		if err := tm.Register(EventTime, 60_000); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for range b.N {
		n += tm.Len(ProcessingTime)
	}
	if n != 0 {
		b.Fatal(n)
	}
}

// BenchmarkTimersWindowCycle is the tumbling-window timer pattern: 100k
// keys each register a timer at the same window end, then the watermark
// passes it and all of them fire (PopDue); a checkpoint (not timed) every
// window. One op = one timer registered and fired.
func BenchmarkTimersWindowCycle(b *testing.B) {
	const keys = 100_000
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	tm := must(NewTimers(be, "t"))
	kk := benchKeys(keys)
	id := uint64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		end := int64(i/keys+1) * 60_000
		n := min(keys, b.N-i)
		for _, k := range kk[:n] {
			be.SetCurrentKey(k)
			if err := tm.Register(EventTime, end); err != nil {
				b.Fatal(err)
			}
		}
		for _, err := range tm.Due(EventTime, end) {
			if err != nil {
				b.Fatal(err)
			}
		}
		i += n
		b.StopTimer()
		id++
		checkpointNow(b, s, be, id)
		b.StartTimer()
	}
}

// BenchmarkSortedEntries is the checkpoint's sort of a layer of 100k
// changed keys of a keyed count plus one key of another state (a keyed
// task's watermark), as Part.WriteTo sorts it.
func BenchmarkSortedEntries(b *testing.B) {
	s := openStore(b, b.TempDir())
	be := newBackend(b, s)
	v := must(NewValue(be, "n", Int64Codec()))
	wm := must(NewValue(be, "runnel.wm", Int64Codec()))
	kbuf := make([]byte, 0, 8)
	for i := range 100_000 {
		kbuf, _ = Int64Codec().Append(kbuf[:0], int64((uint64(i)*7919)%100_000))
		be.SetCurrentKey(kbuf)
		if err := v.Set(int64(i)); err != nil {
			b.Fatal(err)
		}
	}
	be.SetCurrentKey([]byte("wm"))
	if err := wm.Set(1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if got := sortedEntries(be.cur); len(got) != 100_001 {
			b.Fatal(len(got))
		}
	}
}

// BenchmarkWindowCountCheckpointed is the tumbling-window count of the
// end-to-end benchmark (BenchmarkKeyedAgg kind=window) on one subtask, as
// the window operator drives the backend: 50k int64 keys in a scattered
// order, about 10 records per key and window; per record GetBuffered of
// the key's window (a window memory does not know asks the timer index,
// then KnownAbsent), Put, and a timer for a new window; at each window's
// end every timer fires (Get, Delete). A checkpoint (snapshot, commit,
// Committed) every `every` records is timed too: it is part of the cost.
func BenchmarkWindowCountCheckpointed(b *testing.B) {
	for _, every := range []int{100_000, 400_000} {
		b.Run(fmt.Sprint("every=", every), func(b *testing.B) {
			const keys, perWindow = 50_000, 500_000
			s := openStore(b, b.TempDir())
			be := newBackend(b, s)
			m := must(NewMap(be, "window.acc", Int64Codec(), Int64Codec()))
			tm := must(NewTimers(be, "runnel.timers"))
			kbuf := make([]byte, 0, 8)
			id := uint64(0)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cputime.Process()
			defer func() {
				b.ReportMetric(float64((cputime.Process()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			}()
			for i := range b.N {
				end := int64(i/perWindow+1) * 60_000
				if i > 0 && i%perWindow == 0 {
					for tmr, err := range tm.Due(EventTime, end-60_000) {
						if err != nil {
							b.Fatal(err)
						}
						be.SetCurrentKeyGroup(tmr.Key, tmr.KeyGroup)
						if _, ok, err := m.Get(tmr.Timestamp); err != nil || !ok {
							b.Fatal("fired window without state", err)
						}
						if err := m.Delete(tmr.Timestamp); err != nil {
							b.Fatal(err)
						}
					}
				}
				if i > 0 && i%every == 0 {
					id++
					checkpointNow(b, s, be, id)
				}
				kbuf, _ = Int64Codec().Append(kbuf[:0], int64((uint64(i)*7919)%keys))
				be.SetCurrentKey(kbuf)
				n, ok, known, err := m.GetBuffered(end)
				if err != nil {
					b.Fatal(err)
				}
				if !known {
					if tm.Has(EventTime, end) {
						if n, ok, err = m.Get(end); err != nil {
							b.Fatal(err)
						}
					} else {
						m.KnownAbsent()
					}
				}
				if err := m.Put(end, n+1); err != nil {
					b.Fatal(err)
				}
				if !ok {
					if err := tm.Register(EventTime, end); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
