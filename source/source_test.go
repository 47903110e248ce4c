package source

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

func drain[T any](t *testing.T, r SplitReader[T], max int) []T {
	t.Helper()
	var out []T
	for {
		recs, err := r.Poll(context.Background(), max)
		if errors.Is(err, ErrEndOfSplit) {
			if _, err := r.Poll(context.Background(), max); !errors.Is(err, ErrEndOfSplit) {
				t.Fatal("ErrEndOfSplit is not sticky")
			}
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			out = append(out, rec.Value)
		}
	}
}

func TestSliceSplitsAndRestore(t *testing.T) {
	vals := []int{0, 1, 2, 3, 4, 5, 6}
	s := NewSlice(vals, 3)
	splits, _ := s.Splits(context.Background())
	var all []int
	for _, sp := range splits {
		r, err := s.Open(context.Background(), sp, nil)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, drain(t, r, 2)...)
	}
	if len(all) != len(vals) {
		t.Fatalf("read %v", all)
	}
	// Resume split 2 after its first record.
	r, _ := s.Open(context.Background(), splits[2], nil)
	recs, _ := r.Poll(context.Background(), 1)
	if got := binary.BigEndian.Uint64(recs[0].Offset); got != 1 {
		t.Fatalf("record offset %d, want 1", got)
	}
	off := r.Offset()
	r2, err := s.Open(context.Background(), splits[2], off)
	if err != nil {
		t.Fatal(err)
	}
	if rest := drain(t, r2, 10); len(rest) != 2 || rest[0] != 5 || rest[1] != 6 {
		t.Fatalf("resumed %v", rest)
	}
	for _, bad := range [][]byte{{1}, binary.BigEndian.AppendUint64(nil, 99)} {
		if _, err := s.Open(context.Background(), splits[0], bad); !errors.Is(err, ErrBadOffset) {
			t.Fatalf("Open(%x) = %v", bad, err)
		}
	}
	if _, err := s.Open(context.Background(), Split{ID: "x"}, nil); err == nil {
		t.Fatal("unknown split opened")
	}
}

func TestGeneratorDeterministicAndEventTime(t *testing.T) {
	g := NewGenerator(2, 5, func(split int, seq uint64) uint64 { return uint64(split)*100 + seq },
		WithEventTime(func(v uint64) time.Time { return time.Unix(int64(v), 0) }))
	splits, _ := g.Splits(context.Background())
	r, _ := g.Open(context.Background(), splits[1], binary.BigEndian.AppendUint64(nil, 3))
	recs, err := r.Poll(context.Background(), 10)
	if err != nil || len(recs) != 2 || recs[0].Value != 103 || recs[1].EventTime.Unix() != 104 {
		t.Fatalf("recs %+v err %v", recs, err)
	}
	u := NewGenerator(1, -1, func(_ int, seq uint64) uint64 { return seq })
	ur, _ := u.Open(context.Background(), Split{ID: "0"}, nil)
	for range 3 {
		if recs, err := ur.Poll(context.Background(), 1000); err != nil || len(recs) != 1000 {
			t.Fatal("unbounded generator ended")
		}
	}
}

func BenchmarkGeneratorPoll(b *testing.B) {
	b.ReportAllocs()
	g := NewGenerator(1, -1, func(_ int, seq uint64) uint64 { return seq })
	r, _ := g.Open(context.Background(), Split{ID: "0"}, nil)
	for b.Loop() {
		if _, err := r.Poll(context.Background(), 256); err != nil {
			b.Fatal(err)
		}
	}
}
