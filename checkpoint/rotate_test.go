package checkpoint

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestCommitRotatesMemtableForLargeBatch: a commit of at least
// RotateMemTableAt entries onto a memtable that holds earlier commits goes
// into a fresh memtable (Pebble then flushes the old one); smaller commits
// do not rotate, nor does a store with the default options. The state
// reads back the same.
func TestCommitRotatesMemtableForLargeBatch(t *testing.T) {
	s, err := Open(t.TempDir(), Options{RotateMemTableAt: 500})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commitTo := func(s *Store, id uint64, n int) {
		t.Helper()
		p := &testPart{}
		for i := range n {
			p.ops = append(p.ops, op{kind: 'p', uid: "op", kg: uint16(i % 4), key: fmt.Sprintf("k%05d", i), val: fmt.Sprint(id)})
		}
		if _, err := s.Commit(context.Background(), &Commit{ID: id, Parts: []Part{p}}); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(id uint64, n int) { t.Helper(); commitTo(s, id, n) }
	commit(1, 100)
	commit(2, 100)
	m := s.db.Metrics()
	if m.MemTable.Count != 1 || m.Flush.Count != 0 {
		t.Fatalf("small commits: %d memtables, %d flushes; want 1, 0", m.MemTable.Count, m.Flush.Count)
	}
	before := s.sinceRotate
	commit(3, 1000) // onto the memtable holding commits 1 and 2: rotates
	if s.sinceRotate >= before+1000 {
		t.Fatalf("large commit did not rotate: %d entries since the last rotation", s.sinceRotate)
	}
	for deadline := time.Now().Add(10 * time.Second); s.db.Metrics().Flush.Count == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the rotated memtable was not flushed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	before = s.sinceRotate
	commit(4, 100) // small: stays in the new memtable
	if s.sinceRotate < before+100 {
		t.Fatal("a small commit rotated the memtable")
	}
	commit(5, 1000)
	for _, k := range []string{"k00000", "k00999"} {
		kg := uint16(0)
		if k == "k00999" {
			kg = 3
		}
		v, ok, err := s.GetState("op", kg, []byte(k))
		if err != nil || !ok || string(v) != "5" {
			t.Fatalf("%s: %q %v %v", k, v, ok, err)
		}
	}
	// The default leaves the memtable to Pebble.
	d, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	commitTo(d, 1, 100)
	before = d.sinceRotate
	commitTo(d, 2, 100_000)
	if d.sinceRotate < before+100_000 {
		t.Fatal("the default options rotated the memtable")
	}
}
