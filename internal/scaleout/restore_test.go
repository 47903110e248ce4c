package scaleout

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
)

// TestRestoreInterrupted: a rebuild from a snapshot of several chunks that
// breaks off midway (the snapshot's range cut short of its last chunk, as
// when its messages are gone) leaves a store that Open refuses, never a part
// of the snapshot taken for a checkpoint; the next restore into the same
// directory rebuilds it whole, with the segments after the snapshot.
func TestRestoreInterrupted(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, _, _ := r.newOwner(ctx, "A", filepath.Join(t.TempDir(), "a"), 2)
	big := kvPart{}
	for i := range 3000 {
		big[fmt.Sprintf("k%05d", i)] = strings.Repeat(fmt.Sprint(i%10), 1000)
	}
	if err := a.commit(ctx, 1, big); err != nil {
		t.Fatal(err)
	}
	if err := a.commit(ctx, 2, kvPart{"k00001": "changed"}); err != nil {
		t.Fatal(err)
	}
	a.w.MaybeSnapshot(a.store)
	if err := a.w.Close(); err != nil { // the snapshot is written
		t.Fatal(err)
	}
	for id := uint64(3); id <= 4; id++ {
		if err := a.commit(ctx, id, kvPart{fmt.Sprint("new", id): "v"}); err != nil {
			t.Fatal(err)
		}
	}
	want := stateOf(t, a.store)
	base := a.w.latest
	if base.Snapshot.Seq != 2 || base.Snapshot.To-base.Snapshot.From < 3 {
		t.Fatalf("latest record's snapshot %+v: want checkpoint 2's, of several chunks", base.Snapshot)
	}
	v, err := a.f.View(r.log.Task)
	if err != nil {
		t.Fatal(err)
	}
	c := r.cl.NewClient(t)
	dir := filepath.Join(t.TempDir(), "b")
	cut := *base
	cut.Snapshot.To--
	if _, err := Restore(ctx, c, r.group, r.log, dir, &cut, v, checkpoint.Options{}); !errors.Is(err, ErrSegmentGone) {
		t.Fatalf("restore from a snapshot cut short: %v, want ErrSegmentGone", err)
	}
	if s, err := checkpoint.Open(dir, checkpoint.Options{}); !errors.Is(err, checkpoint.ErrIncompleteRestore) {
		if err == nil {
			_ = s.Close()
		}
		t.Fatalf("open after the interrupted restore: %v, want ErrIncompleteRestore", err)
	}
	rep, err := Restore(ctx, c, r.group, r.log, dir, base, v, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.FromSnapshot || rep.Reused || rep.Applied != 2 {
		t.Fatalf("second restore %+v: want the snapshot and 2 segments", rep)
	}
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := stateOf(t, s); got != want {
		t.Fatalf("restored\n%.200s\nwant\n%.200s", got, want)
	}
}
