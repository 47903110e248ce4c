package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
)

func TestKVIdempotentReplay(t *testing.T) {
	dir := t.TempDir()
	type kv struct{ k, v uint64 }
	key := func(r kv) []byte { return binary.BigEndian.AppendUint64(nil, r.k) }
	val := func(dst []byte, r kv) ([]byte, error) { return binary.BigEndian.AppendUint64(dst, r.v), nil }
	s, err := NewKV(dir, key, val)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, r := range []kv{{1, 10}, {2, 20}} {
		if err := s.Write(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Unflushed writes are lost on Close (as on a crash); replays overwrite.
	_ = s.Write(ctx, kv{3, 30})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	s, err = NewKV(dir, key, val)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Get(key(kv{k: 3})); ok {
		t.Fatal("unflushed write survived")
	}
	for _, r := range []kv{{2, 20}, {3, 30}} { // replay
		_ = s.Write(ctx, r)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	n := 0
	for k, v := range s.All() {
		n++
		if binary.BigEndian.Uint64(v) != binary.BigEndian.Uint64(k)*10 {
			t.Fatalf("key %x value %x", k, v)
		}
	}
	if n != 3 {
		t.Fatalf("%d entries, want 3", n)
	}
	// A closed KV says so instead of iterating over nothing.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	n = 0
	for k, v := range s.All() {
		if n++; k != nil || string(v) != ErrClosed.Error() {
			t.Fatalf("after Close, All yielded %q = %q", k, v)
		}
	}
	if n != 1 {
		t.Fatalf("after Close, All yielded %d pairs, want the error only", n)
	}
}

func TestStdoutAndFunc(t *testing.T) {
	var buf bytes.Buffer
	s := NewStdout(&buf, func(v int) string { return "v=" + string(rune('0'+v)) })
	_ = s.Write(context.Background(), 1)
	_ = s.Write(context.Background(), 2)
	if buf.Len() != 0 {
		t.Fatal("Stdout wrote before Flush")
	}
	if err := s.Flush(context.Background()); err != nil || buf.String() != "v=1\nv=2\n" {
		t.Fatalf("%q %v", buf.String(), err)
	}
	var got []int
	f := NewFunc(func(_ context.Context, v int) error { got = append(got, v); return nil }, nil)
	_ = f.Write(context.Background(), 7)
	if err := f.Flush(context.Background()); err != nil || len(got) != 1 {
		t.Fatal(got, err)
	}
}
