package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// copyLog replicates src's log from the dst's end into dst in chunks of
// about chunk bytes, as a slave does, and returns the entries copied.
func copyLog(t testing.TB, src, dst *Store, chunk int) int {
	t.Helper()
	n := 0
	for from := dst.LogEnd(); from < src.LogEnd(); {
		var batch []LogEntry
		next, err := src.ReadLog(from, chunk, func(e *LogEntry) bool {
			c := *e
			c.Record = bytes.Clone(e.Record)
			c.Keys = nil
			e.ForEachKey(func(k []byte) { c.Keys = append(c.Keys, string(k)) })
			if len(c.Keys) != e.KeyCount() {
				t.Fatalf("KeyCount %d, ForEachKey gave %d", e.KeyCount(), len(c.Keys))
			}
			batch = append(batch, c)
			return true
		})
		if err != nil {
			t.Fatalf("ReadLog(%d): %v", from, err)
		}
		if len(batch) == 0 {
			t.Fatalf("ReadLog(%d) delivered nothing below the end %d", from, src.LogEnd())
		}
		if err := dst.AppendLog(context.Background(), batch); err != nil {
			t.Fatalf("AppendLog at %d: %v", from, err)
		}
		n += len(batch)
		from = next
	}
	return n
}

// sameStores fails unless a and b answer every read alike for the queues
// of topics: records, min and max offsets, key lookups, physical lookups
// and the log end.
func sameStores(t testing.TB, a, b *Store, topics map[string]int32, keys []string) {
	t.Helper()
	if a.LogEnd() != b.LogEnd() {
		t.Fatalf("log end %d vs %d", a.LogEnd(), b.LogEnd())
	}
	for topic, queues := range topics {
		for q := range queues {
			for _, f := range []struct {
				name string
				fn   func(*Store) (int64, error)
			}{
				{"min", func(s *Store) (int64, error) { return s.MinOffset(topic, q) }},
				{"max", func(s *Store) (int64, error) { return s.MaxOffset(topic, q) }},
			} {
				va, err1 := f.fn(a)
				vb, err2 := f.fn(b)
				if err1 != nil || err2 != nil || va != vb {
					t.Fatalf("%s/%d %s offset %d (%v) vs %d (%v)", topic, q, f.name, va, err1, vb, err2)
				}
			}
			ra, rb := getAll(t, a, topic, q, 0), getAll(t, b, topic, q, 0)
			if len(ra) != len(rb) {
				t.Fatalf("%s/%d: %d vs %d records", topic, q, len(ra), len(rb))
			}
			for i := range ra {
				if !bytes.Equal(ra[i], rb[i]) {
					t.Fatalf("%s/%d record %d differs", topic, q, i)
				}
				phys := recordPhys(ra[i])
				pa, err1 := a.GetByPhysicalOffset(phys)
				pb, err2 := b.GetByPhysicalOffset(phys)
				if err1 != nil || err2 != nil || !bytes.Equal(pa, pb) {
					t.Fatalf("physical offset %d: %v / %v", phys, err1, err2)
				}
			}
			if len(ra) > 0 {
				ta, err1 := a.SearchOffset(topic, q, recStoreTS(ra[len(ra)/2], 56), false)
				tb, err2 := b.SearchOffset(topic, q, recStoreTS(ra[len(ra)/2], 56), false)
				if err1 != nil || err2 != nil || ta != tb {
					t.Fatalf("%s/%d search offset %d (%v) vs %d (%v)", topic, q, ta, err1, tb, err2)
				}
			}
		}
		for _, k := range keys {
			qa, err1 := a.QueryByKey(topic, k, MaxQueryNum, 0, 1<<62)
			qb, err2 := b.QueryByKey(topic, k, MaxQueryNum, 0, 1<<62)
			if err1 != nil || err2 != nil || len(qa) != len(qb) {
				t.Fatalf("%s key %q: %d (%v) vs %d (%v) results", topic, k, len(qa), err1, len(qb), err2)
			}
			for i := range qa {
				if !bytes.Equal(qa[i], qb[i]) {
					t.Fatalf("%s key %q result %d differs", topic, k, i)
				}
			}
		}
	}
}

func TestLogReplicateCopy(t *testing.T) {
	clk := &testClock{}
	clk.ms.Store(1_000)
	master := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync, Clock: clk.now})
	defer master.Close()
	slaveDir := t.TempDir()
	slave := openTest(t, slaveDir, Options{FlushMode: FlushSync})
	topics := map[string]int32{"a": 3, "b": 2, "gone": 2}
	var keys []string
	rng := rand.New(rand.NewPCG(1, 2))
	put := func(n int) {
		for i := range n {
			var batch []PutMessage
			for range 1 + rng.IntN(3) {
				topic := []string{"a", "b", "gone"}[rng.IntN(3)]
				k := fmt.Sprintf("k%d", rng.IntN(20))
				keys = append(keys, k)
				batch = append(batch, msg(topic, rng.Int32N(topics[topic]), fmt.Sprintf("m%d-%s", i, bytes.Repeat([]byte{'x'}, rng.IntN(300))), k, fmt.Sprintf("u%d", i)))
			}
			clk.ms.Add(int64(rng.IntN(3)))
			mustPut(t, master, batch...)
		}
	}
	put(200)
	// A replica that is halfway when the master deletes a topic: the
	// records it has not got yet leave a hole in the master's log.
	copyLog(t, master, slave, 1+rng.IntN(4000))
	put(100)
	if err := master.DeleteTopic("gone"); err != nil {
		t.Fatal(err)
	}
	if err := slave.DeleteTopic("gone"); err != nil { // as the slave does on the master's delete marker
		t.Fatal(err)
	}
	put(100)
	for slave.LogEnd() < master.LogEnd() {
		copyLog(t, master, slave, 1+rng.IntN(4000))
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	sameStores(t, master, slave, topics, keys)

	// Reopened, the replica is the same, and goes on from its end.
	if err := slave.Close(); err != nil {
		t.Fatal(err)
	}
	slave = openTest(t, slaveDir, Options{FlushMode: FlushSync})
	defer slave.Close()
	sameStores(t, master, slave, topics, keys)
	put(50)
	copyLog(t, master, slave, 64<<10)
	sameStores(t, master, slave, topics, keys)
}

// TestLogReplicateStartsWithHole: a replica of a master whose first
// records were deleted starts its queues at the master's min offsets, and
// keeps them across a reopen.
func TestLogReplicateStartsWithHole(t *testing.T) {
	master := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync})
	defer master.Close()
	for i := range 10 {
		mustPut(t, master, msg("t", 0, fmt.Sprint("m", i)))
	}
	if err := master.TruncateBefore("t", 0, 4); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	slave := openTest(t, dir, Options{})
	copyLog(t, master, slave, 1<<20)
	topics := map[string]int32{"t": 1}
	sameStores(t, master, slave, topics, nil)
	if err := slave.Close(); err != nil {
		t.Fatal(err)
	}
	slave = openTest(t, dir, Options{})
	defer slave.Close()
	sameStores(t, master, slave, topics, nil)
	if min, _ := slave.MinOffset("t", 0); min != 4 {
		t.Fatalf("min offset %d after reopen, want 4", min)
	}
}

func TestLogAppendConflicts(t *testing.T) {
	master := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync})
	defer master.Close()
	for i := range 6 {
		mustPut(t, master, msg("t", int32(i%2), fmt.Sprint("m", i)))
	}
	var entries []LogEntry
	if _, err := master.ReadLog(0, 1<<20, func(e *LogEntry) bool {
		c := *e
		c.Record, c.rawKeys = bytes.Clone(e.Record), nil
		entries = append(entries, c)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	slave := openTest(t, t.TempDir(), Options{})
	defer slave.Close()
	if err := slave.AppendLog(context.Background(), entries[:3]); err != nil {
		t.Fatal(err)
	}
	end := slave.LogEnd()
	fieldMismatch := entries[3]
	fieldMismatch.Record = bytes.Clone(entries[3].Record)
	fieldMismatch.QueueOffset++
	// Entries alternate queues 0 and 1: the slave has queue 1 offset 0
	// (entry 1), so an entry past the log end at queue 1 offset 0 goes back.
	back := entries[5]
	back.Record = bytes.Clone(entries[5].Record)
	back.Phys = master.LogEnd() + 100
	back.QueueOffset = 0
	putU64(back.Record[posPhysOffset:], back.Phys)
	putU64(back.Record[posQueueOffset:], 0)
	for _, c := range []struct {
		name  string
		batch []LogEntry
	}{
		{"below the log end", []LogEntry{entries[2]}},
		{"queue offset goes back", []LogEntry{back}},
		{"record fields mismatched", []LogEntry{fieldMismatch}},
		{"conflict after a good entry", []LogEntry{entries[3], entries[3]}},
	} {
		err := slave.AppendLog(context.Background(), c.batch)
		if !errors.Is(err, ErrLogConflict) {
			t.Errorf("%s: AppendLog = %v, want ErrLogConflict", c.name, err)
		}
		if slave.LogEnd() != end {
			t.Fatalf("%s: log end moved to %d", c.name, slave.LogEnd())
		}
	}
	if err := slave.AppendLog(context.Background(), entries[3:]); err != nil {
		t.Fatal(err)
	}
	sameStores(t, master, slave, map[string]int32{"t": 2}, nil)
}

func putU64(b []byte, v int64) {
	for i := range 8 {
		b[i] = byte(uint64(v) >> (56 - 8*i))
	}
}

func TestLogTruncate(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	var res []PutResult
	for i := range 12 {
		res = append(res, mustPut(t, s, msg("t", int32(i%3), fmt.Sprint("m", i), fmt.Sprint("k", i)))...)
	}
	if err := s.AddEpoch(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEpoch(2, res[6].PhysicalOffset); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEpoch(3, res[9].PhysicalOffset); err != nil {
		t.Fatal(err)
	}
	cut := res[7].PhysicalOffset
	if err := s.TruncateLog(cut); err != nil {
		t.Fatal(err)
	}
	check := func(s *Store) {
		t.Helper()
		if s.LogEnd() != cut {
			t.Fatalf("log end %d, want %d", s.LogEnd(), cut)
		}
		// Messages 0..6 remain: queue 0 holds 0,3,6; queue 1 holds 1,4; queue 2 holds 2,5.
		for q, want := range []int64{3, 2, 2} {
			if max, _ := s.MaxOffset("t", int32(q)); max != want {
				t.Fatalf("queue %d max offset %d, want %d", q, max, want)
			}
		}
		for i := range 12 {
			got, _ := s.QueryByKey("t", fmt.Sprint("k", i), 10, 0, 1<<62)
			if (i < 7) != (len(got) == 1) {
				t.Fatalf("key k%d: %d results after the truncation", i, len(got))
			}
			_, err := s.GetByPhysicalOffset(res[i].PhysicalOffset)
			if (i < 7) != (err == nil) {
				t.Fatalf("message %d by physical offset: %v", i, err)
			}
		}
		epochs, err := s.Epochs()
		if err != nil || len(epochs) != 2 || epochs[1] != (Epoch{2, res[6].PhysicalOffset}) {
			t.Fatalf("epochs %v (%v), want epochs 1 and 2", epochs, err)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	check(s)
	// Writing goes on from the cut, at the removed offsets.
	r := mustPut(t, s, msg("t", 1, "again"))
	if r[0].PhysicalOffset != cut || r[0].QueueOffset != 2 {
		t.Fatalf("next message at physical %d queue offset %d, want %d and 2", r[0].PhysicalOffset, r[0].QueueOffset, cut)
	}
}

func TestLogEpochs(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	e, err := s.StartEpoch()
	if err != nil || e != (Epoch{1, 0}) {
		t.Fatalf("first epoch %v %v", e, err)
	}
	// No record written in epoch 1: it is renumbered, not piled up.
	if e, err = s.StartEpoch(); err != nil || e != (Epoch{2, 0}) {
		t.Fatalf("second epoch %v %v", e, err)
	}
	r := mustPut(t, s, msg("t", 0, "x"))
	end := r[0].PhysicalOffset + int64(len(msg("t", 0, "x").Record))
	if e, err = s.StartEpoch(); err != nil || e != (Epoch{3, end}) {
		t.Fatalf("third epoch %v %v", e, err)
	}
	if err := s.AddEpoch(3, end); err == nil {
		t.Fatal("AddEpoch accepted an epoch not above the last")
	}
	if err := s.AddEpoch(4, end-1); err == nil {
		t.Fatal("AddEpoch accepted a start below the last epoch's")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	epochs, err := s.Epochs()
	if err != nil || !slices.Equal(epochs, []Epoch{{2, 0}, {3, end}}) {
		t.Fatalf("epochs after reopen %v %v", epochs, err)
	}
	id, err := s.EnsureLogID()
	if err != nil || len(id) != 32 {
		t.Fatalf("log id %q %v", id, err)
	}
	if again, _ := s.EnsureLogID(); again != id {
		t.Fatalf("log id changed from %q to %q", id, again)
	}
}

// TestLogAppendTopicAliasingBuffer: entries whose topic aliases a buffer
// the caller reuses (a slave's frame buffer) leave the store's queues
// intact: the store keeps its own copy of the name.
func TestLogAppendTopicAliasingBuffer(t *testing.T) {
	master := openTest(t, t.TempDir(), Options{FlushMode: FlushAsync})
	defer master.Close()
	mustPut(t, master, msg("first-topic", 0, "a"))
	mustPut(t, master, msg("other-topic", 0, "b"))
	slave := openTest(t, t.TempDir(), Options{})
	defer slave.Close()
	buf := make([]byte, 64)
	if _, err := master.ReadLog(0, 1<<20, func(e *LogEntry) bool {
		n := copy(buf, e.Topic)
		c := *e
		c.Topic = unsafeString(buf[:n]) // as protocol.DecodeRecord aliases a frame
		c.Record, c.rawKeys = bytes.Clone(e.Record), nil
		if err := slave.AppendLog(context.Background(), []LogEntry{c}); err != nil {
			t.Fatal(err)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"first-topic", "other-topic"} {
		if n, _ := slave.MaxOffset(topic, 0); n != 1 {
			t.Fatalf("%s max offset %d after the buffer was reused, want 1", topic, n)
		}
	}
}
