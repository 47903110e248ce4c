package scaleout

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	r := &Record{
		Kind: KindCommitRecord, Task: "src@broker-a/3", OwnerEpoch: 7, Seq: 42, PrevSeq: 40, PrevOffset: 17,
		Nonce: 0xdeadbeef, Worker: "127.0.0.1@w1", TimeMs: 1700000000000,
		Snapshot: Segment{Seq: 30, From: 100, To: 140},
		Segments: []Segment{{Seq: 31, From: 140, To: 141}, {Seq: 42, From: 150, To: 152}},
		History:  []EpochStart{{Epoch: 1, FromSeq: 1}, {Epoch: 7, FromSeq: 20}},
		Sinks:    []SinkTxn{{Sink: "out", Epoch: 41, Info: []byte{1, 2, 3}}, {Sink: "dlq", Epoch: 42}},
	}
	r.Fingerprint[0], r.Fingerprint[31] = 9, 8
	b := AppendRecord(nil, r)
	got, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Sinks[1].Info == nil {
		got.Sinks[1].Info = nil // decoded as empty, not nil
	}
	r.Sinks[1].Info = got.Sinks[1].Info
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
	}
	// Every strict prefix is refused, never a panic.
	for i := range len(b) {
		if _, err := DecodeRecord(b[:i]); err == nil {
			t.Fatalf("prefix of %d bytes decoded", i)
		}
	}
	if _, err := DecodeRecord(append(bytes.Clone(b), 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
}

func TestRecordCheck(t *testing.T) {
	bad := []*Record{
		{Kind: KindClaim, Task: "t", Seq: 5, PrevSeq: 4},
		{Kind: KindCommitRecord, Task: "t", Seq: 4, PrevSeq: 4},
		{Kind: KindCommitRecord, Task: "", Seq: 5, PrevSeq: 4},
		{Kind: KindCommitRecord, Task: "t", Seq: 5, PrevSeq: 4, Segments: []Segment{{Seq: 3, From: 5, To: 4}}},
		{Kind: KindCommitRecord, Task: "t", Seq: 5, PrevSeq: 4, OwnerEpoch: 2, History: []EpochStart{{Epoch: 2, FromSeq: 1}, {Epoch: 1, FromSeq: 3}}},
		{Kind: KindCommitRecord, Task: "t", Seq: 5, PrevSeq: 4, OwnerEpoch: 3, History: []EpochStart{{Epoch: 2, FromSeq: 1}}},
	}
	for i, r := range bad {
		if _, err := DecodeRecord(AppendRecord(nil, r)); !errors.Is(err, ErrBadRecord) {
			t.Errorf("record %d: %v, want ErrBadRecord", i, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, &Record{Kind: KindClaim, Task: "t", OwnerEpoch: 1, PrevOffset: -1, History: []EpochStart{{1, 1}}}))
	f.Add(AppendRecord(nil, &Record{Kind: KindCommitRecord, Task: "t", OwnerEpoch: 1, Seq: 3, PrevOffset: 0,
		Segments: []Segment{{Seq: 3, From: 1, To: 2}}, Sinks: []SinkTxn{{Sink: "s", Epoch: 3, Info: []byte("x")}}}))
	// Invariant: DecodeRecord never panics, and whatever it accepts
	// re-encodes to bytes that decode to the same record (varints may have
	// had a longer form than the encoder writes).
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			return
		}
		again, err := DecodeRecord(AppendRecord(nil, r))
		if err != nil {
			t.Fatalf("re-encoded record refused: %v", err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoding differs:\n%+v\n%+v", r, again)
		}
	})
}

// chainWriter builds records the way a writer does: after the chain's
// latest valid record.
type chainWriter struct {
	t     *testing.T
	c     *Chain
	log   []*Record // the queue, in order
	epoch uint64
}

func (w *chainWriter) claim() *Record {
	l, off, ok := w.c.Latest()
	r := &Record{Kind: KindClaim, Task: w.c.Task(), OwnerEpoch: w.epoch, PrevOffset: off, History: w.c.NextHistory(w.epoch)}
	if ok {
		r.Seq, r.PrevSeq = l.Seq, l.Seq
	}
	return r
}

func (w *chainWriter) commit(seq uint64) *Record {
	l, off, _ := w.c.Latest()
	return &Record{Kind: KindCommitRecord, Task: w.c.Task(), OwnerEpoch: w.epoch, Seq: seq, PrevSeq: l.Seq, PrevOffset: off,
		History: w.c.NextHistory(w.epoch)}
}

// TestChainFencesZombie: owner 1 commits, owner 2 claims and commits, and
// owner 1's late commit (built on its own, older view) is invalid for every
// reader; tags decide accordingly.
func TestChainFencesZombie(t *testing.T) {
	task := "src@b/0"
	c := NewChain(task)
	var queue []*Record
	appendRec := func(r *Record) bool {
		queue = append(queue, r)
		return c.Apply(int64(len(queue)-1), r)
	}
	w1 := &chainWriter{c: c, epoch: 1}
	if !appendRec(w1.claim()) {
		t.Fatal("first claim invalid")
	}
	if !appendRec(w1.commit(3)) {
		t.Fatal("owner 1's commit 3 invalid")
	}
	// Owner 1 prepares commit 5 on its view (latest = 3) but is paused.
	late := w1.commit(5)
	w2 := &chainWriter{c: c, epoch: c.MaxEpoch() + 1}
	if !appendRec(w2.claim()) {
		t.Fatal("owner 2's claim invalid")
	}
	if appendRec(late) {
		t.Fatal("the paused owner's late commit counts after the claim")
	}
	if !appendRec(w2.commit(6)) {
		t.Fatal("owner 2's commit 6 invalid")
	}
	for _, tc := range []struct {
		owner, epoch uint64
		want         Verdict
	}{
		{1, 1, Valid}, {1, 3, Valid}, {1, 4, Invalid}, {1, 5, Invalid}, {2, 4, Valid}, {2, 6, Valid},
		{2, 3, Invalid}, {2, 7, Undecided}, {1, 7, Invalid}, {3, 9, Undecided},
	} {
		if got := c.Decide(tc.owner, tc.epoch); got != tc.want {
			t.Errorf("Decide(owner %d, epoch %d) = %v, want %v", tc.owner, tc.epoch, got, tc.want)
		}
	}
	// A reader that anchors at owner 2's claim reaches the same verdicts
	// for everything after it.
	r2 := NewChain(task)
	r2.Anchor(2, queue[2])
	for i := 3; i < len(queue); i++ {
		if got, want := r2.Apply(int64(i), queue[i]), i == 4; got != want {
			t.Fatalf("anchored reader: record %d valid=%v, want %v", i, got, want)
		}
	}
	if got := r2.Decide(1, 5); got != Invalid {
		t.Fatalf("anchored reader: Decide(1, 5) = %v", got)
	}
}

// TestChainControlWithoutChainCheck is the control: a reader that accepts
// every record of its task (no previous-record check) takes the paused
// owner's late commit, and then tags of the fenced owner count: the check
// is what excludes them.
func TestChainControlWithoutChainCheck(t *testing.T) {
	task := "src@b/0"
	c := NewChain(task)
	w1 := &chainWriter{c: c, epoch: 1}
	c.Apply(0, w1.claim())
	c.Apply(1, w1.commit(3))
	late := w1.commit(5)
	w2 := &chainWriter{c: c, epoch: 2}
	c.Apply(2, w2.claim())
	naive := NewChain(task)
	naive.Anchor(2, func() *Record { r, _, _ := c.Latest(); return r }())
	naive.accept(3, late) // what a reader without the chain check does
	if got := naive.Decide(1, 5); got != Valid {
		t.Fatalf("control: Decide(1, 5) = %v; the control should (wrongly) count the late commit", got)
	}
	if got := c.Decide(1, 5); got != Invalid {
		t.Fatalf("checked chain: Decide(1, 5) = %v", got)
	}
}

func TestChainDuplicateRecord(t *testing.T) {
	c := NewChain("t")
	w := &chainWriter{c: c, epoch: 1}
	claim := w.claim()
	c.Apply(0, claim)
	r := w.commit(2)
	r.Nonce = 77
	if !c.Apply(1, r) {
		t.Fatal("commit invalid")
	}
	dup := *r
	if c.Apply(2, &dup) {
		t.Fatal("a retried copy of the same record counts twice")
	}
	if l, off, _ := c.Latest(); l.Nonce != 77 || off != 1 {
		t.Fatalf("latest %+v at %d", l, off)
	}
}

func TestChainSinkInfo(t *testing.T) {
	c := NewChain("t")
	w := &chainWriter{c: c, epoch: 1}
	c.Apply(0, w.claim())
	r := w.commit(2)
	r.Sinks = []SinkTxn{{Sink: "out", Epoch: 1, Info: []byte("a")}, {Sink: "out", Epoch: 2, Info: []byte("b")}}
	c.Apply(1, r)
	if b, ok := c.SinkInfo("out", 1); !ok || string(b) != "a" {
		t.Fatalf("SinkInfo(out, 1) = %q %v", b, ok)
	}
	if _, ok := c.SinkInfo("dlq", 2); ok {
		t.Fatal("info for a sink that had no transaction")
	}
}
