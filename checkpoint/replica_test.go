package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// dump is every key and value of a store's families except the format
// record (each store writes its own when it is created).
func dump(t *testing.T, s *Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{famSystem}, UpperBound: []byte{famEnd}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = it.Close() }()
	for ok := it.First(); ok; ok = it.Next() {
		if bytes.Equal(it.Key(), keyFormat) {
			continue
		}
		out[string(it.Key())] = string(it.Value())
	}
	return out
}

// TestReplicaFollowsCapturedBatches: a store that replays the batches its
// primary's Commits captured — from empty, or from a savepoint of the
// primary taken part-way — holds exactly the primary's keys after each one;
// a batch applied twice or out of order is refused before anything is
// written, and a damaged batch is refused.
func TestReplicaFollowsCapturedBatches(t *testing.T) {
	ctx := context.Background()
	primary, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = primary.Close() }()
	fromEmpty, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fromEmpty.Close() }()
	var batches [][]byte
	var savepoint bytes.Buffer
	for id := uint64(1); id <= 6; id++ {
		c := &Commit{ID: id, CaptureBatch: true,
			Offsets: map[string][]byte{SplitKey("src", "q0"): fmt.Appendf(nil, "off%d", id)},
			Pending: []PendingCommit{{SinkUID: "out", CheckpointID: id, Data: []byte("txn")}},
			Parts: []Part{&testPart{ops: []op{
				{kind: 'p', uid: "count", kg: uint16(id % 3), key: fmt.Sprint("k", id), val: "v"},
				{kind: 'd', uid: "count", kg: uint16((id - 1) % 3), key: fmt.Sprint("k", id-1)},
			}}}}
		if id > 1 {
			c.Resolved = []PendingCommit{{SinkUID: "out", CheckpointID: id - 1}}
		}
		if _, err := primary.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
		batches = append(batches, bytes.Clone(c.Batch))
		if _, err := fromEmpty.ApplyBatch(c.Batch, false); err != nil {
			t.Fatalf("apply batch %d: %v", id, err)
		}
		if got, want := dump(t, fromEmpty), dump(t, primary); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after batch %d the replica differs:\n got %q\nwant %q", id, got, want)
		}
		if id == 3 {
			if err := primary.WriteSavepoint(ctx, &savepoint); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m, ok := fromEmpty.Latest(); !ok || m.ID != 6 {
		t.Fatalf("replica latest %+v", m)
	}
	if _, err := fromEmpty.ApplyBatch(batches[5], false); !errors.Is(err, ErrStaleID) {
		t.Fatalf("batch applied twice: %v, want ErrStaleID", err)
	}
	// From a savepoint of checkpoint 3 plus batches 4..6.
	dir := t.TempDir()
	if err := RestoreSavepoint(ctx, dir, &savepoint, Options{}); err != nil {
		t.Fatal(err)
	}
	fromSave, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fromSave.Close() }()
	if _, err := fromSave.ApplyBatch(batches[4], false); !errors.Is(err, ErrNotNext) {
		t.Fatalf("batch 5 onto checkpoint 3 without batch 4: %v, want ErrNotNext", err)
	}
	for _, b := range batches[3:] {
		if _, err := fromSave.ApplyBatch(b, true); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := dump(t, fromSave), dump(t, primary); len(got) == 0 || !sameExceptMeta(got, want) {
		t.Fatalf("replica from savepoint differs:\n got %q\nwant %q", got, want)
	}
	damaged := bytes.Clone(batches[0])
	damaged[len(damaged)-3] ^= 0xff
	other, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	if _, err := other.ApplyBatch(damaged[:len(damaged)-5], false); err == nil {
		t.Fatal("truncated batch applied")
	}
}

// sameExceptMeta compares two dumps ignoring checkpoint metadata values
// (a savepoint restore rewrites its checkpoint's metadata).
func sameExceptMeta(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || (k[0] != famMeta && v != w) {
			return false
		}
	}
	return true
}
