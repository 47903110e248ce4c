package state

import (
	"encoding/binary"
	"testing"

	"github.com/runnel-dev/runnel/checkpoint"
)

// partKeys returns the state keys (without key group) that the Part of
// snapshot id writes, with "-" before a deletion.
func partKeys(t *testing.T, b *Backend, id uint64) (map[string]bool, func()) {
	t.Helper()
	p := b.Snapshot(id).(*part)
	out := map[string]bool{}
	for _, l := range p.layers {
		for _, sk := range sortedEntries(l) {
			k := sk.key[2:]
			if l.ents.at(sk.i).del {
				k = "-" + k
			}
			out[k] = true
		}
	}
	commit := func() {
		if _, err := b.store.Commit(t.Context(), &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{p}}); err != nil {
			t.Fatal(err)
		}
		b.Committed(id)
	}
	return out, commit
}

// State created and deleted between two checkpoints never reaches the
// store: the checkpoint writes no deletion for it and the read cache gets
// no entry. State that reached the store is deleted from it. Timers follow
// the same rule and are never cached.
func TestFreshDeletesWriteNothing(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	b := newBackend(t, s)
	m := must(NewMap(b, "acc", Int64Codec(), Int64Codec()))
	v := must(NewValue(b, "val", Int64Codec()))
	tm := must(NewTimers(b, "timers"))
	key := func(h *handle, mk int64) string {
		k := string(appendLayerKey(nil, b.kg, h.prefix, b.keyPart))
		if mk >= 0 {
			k = string(must(Int64Codec().Append([]byte(k), mk)))
		}
		return k
	}
	timerKey := func(ts int64) string {
		k := must(tm.timerKey(EventTime, ts))
		return string(k)
	}

	b.SetCurrentKey([]byte("a"))
	if err := m.Put(1, 10); err != nil {
		t.Fatal(err)
	}
	if err := tm.Register(EventTime, 100); err != nil {
		t.Fatal(err)
	}
	checkpointNow(t, s, b, 1)
	kPersisted, kTimer100 := key(&m.h, 1), timerKey(100)

	// Interval 2: entry 2 created (known absent from memory, as the window
	// operator tells it) and deleted; entry 1 (in the store) deleted;
	// value of b created after a store read found nothing, then cleared;
	// a timer registered and fired; the stored timer fired.
	if _, _, known, err := m.GetBuffered(2); err != nil || known {
		t.Fatalf("GetBuffered(2): known %v, %v", known, err)
	}
	m.KnownAbsent()
	must(0, m.Put(2, 20))
	kFresh := key(&m.h, 2)
	if _, ok, err := m.Get(1); err != nil || !ok {
		t.Fatalf("Get(1) = %v, %v", ok, err)
	}
	must(0, m.Delete(1))
	must(0, m.Delete(2))
	b.SetCurrentKey([]byte("b"))
	if _, ok, err := v.Get(); err != nil || ok {
		t.Fatalf("Get(b) = %v, %v", ok, err)
	}
	must(0, v.Set(5))
	must(0, v.Clear())
	kVal := key(&v.h, -1)
	must(0, tm.Register(EventTime, 50))
	kTimer50 := timerKey(50)
	var fired []string
	for timer, err := range tm.Due(EventTime, 100) {
		if err != nil {
			t.Fatal(err)
		}
		fired = append(fired, string(timer.Key))
	}
	if len(fired) != 2 || fired[0] != "b" || fired[1] != "a" {
		t.Fatalf("fired %q", fired)
	}
	writes, commit := partKeys(t, b, 2)
	for _, k := range []string{kFresh, kVal, kTimer50} {
		if writes[k[2:]] || writes["-"+k[2:]] {
			t.Errorf("checkpoint 2 writes fresh key %x", k)
		}
	}
	for _, k := range []string{kPersisted, kTimer100} {
		if !writes["-"+k[2:]] {
			t.Errorf("checkpoint 2 does not delete stored key %x", k)
		}
	}
	if len(writes) != 2 {
		t.Errorf("checkpoint 2 writes %d keys, want 2", len(writes))
	}
	commit()
	for _, k := range []string{kFresh, kTimer50, kTimer100} {
		if _, cached := b.cache.index[k]; cached {
			t.Errorf("key %x cached", k)
		}
	}
	// The store read of b's value cached its absence; it stays absent.
	if _, ok, hit := b.cache.get([]byte(kVal)); !hit || ok {
		t.Errorf("value of b: cached %v, present %v", hit, ok)
	}
	for _, k := range []string{kPersisted, kTimer100} {
		kb := []byte(k)
		if _, ok, err := s.GetState("op", binary.BigEndian.Uint16(kb), kb[2:]); err != nil || ok {
			t.Errorf("stored key %x still in the store (%v)", k, err)
		}
	}

	// A restored backend sees none of it.
	b2 := newBackend(t, s)
	m2 := must(NewMap(b2, "acc", Int64Codec(), Int64Codec()))
	v2 := must(NewValue(b2, "val", Int64Codec()))
	tm2 := must(NewTimers(b2, "timers"))
	if n := tm2.Len(EventTime); n != 0 {
		t.Fatalf("%d timers restored", n)
	}
	b2.SetCurrentKey([]byte("a"))
	if empty, err := m2.IsEmpty(); err != nil || !empty {
		t.Fatalf("map of a after restore: empty %v, %v", empty, err)
	}
	b2.SetCurrentKey([]byte("b"))
	if _, ok, err := v2.Get(); err != nil || ok {
		t.Fatalf("value of b after restore: %v, %v", ok, err)
	}
}

// A fresh entry put again after its deletion is written, and a deletion
// of a key whose older, uncommitted layer holds a value is written too.
func TestFreshRecreatedAndFrozenValue(t *testing.T) {
	s := openStore(t, t.TempDir())
	b := newBackend(t, s)
	v := must(NewValue(b, "val", Int64Codec()))
	b.SetCurrentKey([]byte("k"))
	if _, ok, err := v.Get(); err != nil || ok {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	must(0, v.Set(1))
	must(0, v.Clear())
	must(0, v.Set(2))
	w1, commit1 := partKeys(t, b, 1)
	if len(w1) != 1 {
		t.Fatalf("checkpoint 1 writes %v", w1)
	}
	// Key k is in frozen layer 1 (not committed yet): a deletion of it
	// must be written, though the cache and store lack it.
	if x, ok, err := v.Get(); err != nil || !ok || x != 2 {
		t.Fatalf("Get = %d, %v, %v", x, ok, err)
	}
	must(0, v.Clear())
	w2, commit2 := partKeys(t, b, 2)
	commit1()
	commit2()
	deletes := 0
	for k := range w2 {
		if k[0] == '-' {
			deletes++
		}
	}
	if deletes != 1 {
		t.Fatalf("checkpoint 2 writes %v, want the deletion", w2)
	}
	b2 := newBackend(t, s)
	v2 := must(NewValue(b2, "val", Int64Codec()))
	b2.SetCurrentKey([]byte("k"))
	if _, ok, err := v2.Get(); err != nil || ok {
		t.Fatalf("restored: %v, %v", ok, err)
	}
}
