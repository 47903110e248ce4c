package store

import (
	"errors"
	"testing"
)

// A MetaBatch writes its meta keys, deletions and offsets together and
// they survive a reopen; one invalid change fails the batch and writes
// nothing of it.
func TestMetaBatch(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	if err := s.PutMeta([]byte("pop/old"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	mb := s.NewMetaBatch()
	mb.PutMeta([]byte("pop/ck/1"), []byte("ck"))
	mb.DeleteMeta([]byte("pop/old"))
	mb.CommitOffset("G", "T", 2, 42)
	if mb.Len() != 3 {
		t.Fatalf("Len = %d", mb.Len())
	}
	if err := mb.Commit(true); err != nil {
		t.Fatal(err)
	}
	bad := s.NewMetaBatch()
	bad.PutMeta([]byte("pop/ck/2"), []byte("ck"))
	bad.CommitOffset("G", "T", 2, -1)
	if err := bad.Commit(true); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid batch: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	if v, ok, err := s.GetMeta([]byte("pop/ck/1")); err != nil || !ok || string(v) != "ck" {
		t.Errorf("pop/ck/1 = %q %v %v", v, ok, err)
	}
	if _, ok, _ := s.GetMeta([]byte("pop/old")); ok {
		t.Error("pop/old was not deleted")
	}
	if _, ok, _ := s.GetMeta([]byte("pop/ck/2")); ok {
		t.Error("the failed batch wrote pop/ck/2")
	}
	if off, ok, err := s.QueryOffset("G", "T", 2); err != nil || !ok || off != 42 {
		t.Errorf("offset = %d %v %v", off, ok, err)
	}
}
