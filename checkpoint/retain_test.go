package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCheckpointRetainedRestore commits 12 random checkpoints keeping 3
// retained copies and writing a savepoint of checkpoint 5, then restores
// each retained copy and the savepoint in turn: the store's content must be
// exactly that checkpoint's (model), under a new, higher id; the restore is
// applied once per spec; pruned and unknown ids are refused and name what
// is restorable.
func TestCheckpointRetainedRestore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fp := Fingerprint{MaxParallelism: 4, Operators: []OperatorInfo{{UID: "opA", Kind: "k", Codecs: "c"}, {UID: "opB", Kind: "k", Codecs: "c"}}}
	s, err := Open(dir, Options{Fingerprint: fp, KeepCopies: 3})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	model := emptyContent()
	models := map[uint64]content{}
	for id := uint64(1); id <= 12; id++ {
		c := randomCommit(rng, id, model, false)
		if _, err := s.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
		model.apply(c)
		models[id] = model.clone()
		if _, err := s.KeepCopy(); err != nil {
			t.Fatal(err)
		}
		if id == 5 {
			sv, err := s.NewSavepoint()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sv.WriteFile(ctx, SavepointPath(dir, 5)); err != nil {
				t.Fatal(err)
			}
			_ = sv.Close()
		}
	}
	points, err := ListRestorePoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range points {
		got = append(got, strconv.FormatUint(p.ID, 10)+p.Kind)
		if p.Size <= 0 {
			t.Errorf("restore point %d %s has size %d", p.ID, p.Kind, p.Size)
		}
	}
	if want := "[12retained 11retained 10retained 5savepoint]"; fmtSlice(got) != want {
		t.Fatalf("restore points %v, want %s", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	nextID := uint64(13)
	for _, spec := range []string{"10", "5", SavepointPath(dir, 5), "12", "11"} {
		res, err := RestoreFrom(ctx, dir, spec, Options{Fingerprint: fp})
		if err != nil {
			t.Fatalf("restore %s: %v", spec, err)
		}
		if !res.Applied || res.Latest.ID != nextID {
			t.Fatalf("restore %s: applied %v as %d, want applied as %d", spec, res.Applied, res.Latest.ID, nextID)
		}
		s, err := Open(dir, Options{Fingerprint: fp, KeepCopies: 3})
		if err != nil {
			t.Fatal(err)
		}
		want := models[res.From.ID].clone()
		want.ID = nextID
		if have := readContent(t, s); !sameContent(have, want) {
			t.Fatalf("restore %s: content differs from checkpoint %d: %s", spec, res.From.ID, diffContent(have, want))
		}
		if md, _ := s.Latest(); md.RestoredFrom != res.From.ID || md.Restore != spec {
			t.Fatalf("restore %s: metadata %+v", spec, md)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// The same spec again: nothing happens (a restarted job resumes).
		again, err := RestoreFrom(ctx, dir, spec, Options{Fingerprint: fp})
		if err != nil || again.Applied || again.Latest.ID != nextID {
			t.Fatalf("restore %s again: applied %v, latest %d, %v", spec, again.Applied, again.Latest.ID, err)
		}
		nextID++
	}
	// Pruned (1) and unknown ids fail and say what can be restored.
	for _, spec := range []string{"1", "99"} {
		_, err := RestoreFrom(ctx, dir, spec, Options{Fingerprint: fp})
		if !errors.Is(err, ErrInvalid) || !containsAll(err.Error(), "neither retained nor a savepoint", "12 (retained)", "5 (savepoint)") {
			t.Fatalf("restore %s: %v", spec, err)
		}
	}
	// Another job's fingerprint is refused.
	other := Fingerprint{MaxParallelism: 8}
	if _, err := RestoreFrom(ctx, dir, "10", Options{Fingerprint: other}); !errors.Is(err, ErrFingerprintMismatch) {
		t.Fatalf("restore with another fingerprint: %v", err)
	}
	// A corrupt savepoint fails and leaves the store as it was.
	bad := filepath.Join(t.TempDir(), "bad.savepoint")
	b, _ := os.ReadFile(SavepointPath(dir, 5))
	if err := os.WriteFile(bad, b[:len(b)-9], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := RestoreFrom(ctx, dir, bad, Options{Fingerprint: fp}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("restore of a truncated savepoint: %v", err)
	}
	if _, err := Open(dir, Options{Fingerprint: fp}); !errors.Is(err, ErrIncompleteRestore) {
		t.Fatalf("open after an interrupted restore: %v (want ErrIncompleteRestore)", err)
	}
	if _, err := RestoreFrom(ctx, dir, "12", Options{Fingerprint: fp}); err != nil {
		t.Fatalf("redo after the interrupted restore: %v", err)
	}
	s, err = Open(dir, Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	want := models[12].clone()
	md, _ := s.Latest()
	want.ID = md.ID
	if have := readContent(t, s); !sameContent(have, want) {
		t.Fatalf("content after the redone restore: %s", diffContent(have, want))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func fmtSlice(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
