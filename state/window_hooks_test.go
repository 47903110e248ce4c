package state

import (
	"errors"
	"testing"

	"github.com/runnel-dev/runnel/checkpoint"
)

// GetBuffered answers from the current and frozen layers and the cache of
// committed values, and says when only the store knows.
func TestMapGetBuffered(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	m := must(NewMap(b, "acc", StringCodec(), Int64Codec()))
	b.SetCurrentKey([]byte("k"))
	want := func(k string, v int64, ok, known bool) {
		t.Helper()
		gv, gok, gknown, err := m.GetBuffered(k)
		if err != nil || gv != v || gok != ok || gknown != known {
			t.Fatalf("GetBuffered(%q) = %d, %v, %v, %v; want %d, %v, %v", k, gv, gok, gknown, err, v, ok, known)
		}
	}
	want("a", 0, false, false) // nothing anywhere: only the store could tell
	if err := m.Put("a", 1); err != nil {
		t.Fatal(err)
	}
	if err := m.Put("b", 2); err != nil {
		t.Fatal(err)
	}
	want("a", 1, true, true) // current layer
	p := b.Snapshot(1)
	want("a", 1, true, true) // frozen layer
	if err := m.Delete("b"); err != nil {
		t.Fatal(err)
	}
	want("b", 0, false, true) // a deletion in the current layer
	if _, err := s.Commit(t.Context(), &checkpoint.Commit{ID: 1, Parts: []checkpoint.Part{p}}); err != nil {
		t.Fatal(err)
	}
	b.Committed(1)
	want("a", 1, true, true) // cache of committed values
	checkpointNow(t, s, b, 2)
	want("b", 0, false, true) // a committed deletion, cached

	// A restarted backend knows nothing until it reads the store.
	b2 := newBackend(t, s)
	m = must(NewMap(b2, "acc", StringCodec(), Int64Codec()))
	if _, _, _, err := m.GetBuffered("a"); !errors.Is(err, ErrNoCurrentKey) {
		t.Fatalf("no current key: %v", err)
	}
	b2.SetCurrentKey([]byte("k"))
	want("a", 0, false, false)
	if v, ok, err := m.Get("a"); err != nil || !ok || v != 1 {
		t.Fatalf("Get after restart = %d, %v, %v", v, ok, err)
	}
	want("a", 1, true, true) // the store read filled the cache
	if _, ok, err := m.Get("c"); err != nil || ok {
		t.Fatalf("Get(c) = %v, %v", ok, err)
	}
	want("c", 0, false, true) // absence is cached too
}
