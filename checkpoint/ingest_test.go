package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/runnel-dev/runnel/checkpoint/internal/storefs"
)

// ingestFixture commits a few random checkpoints (one big) and returns the
// savepoint of the latest with its content.
func ingestFixture(t *testing.T, fp Fingerprint) ([]byte, content) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	model := emptyContent()
	for id := uint64(1); id <= 4; id++ {
		c := randomCommit(rng, id, model, id == 3)
		if _, err := s.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
		model.apply(c)
	}
	var buf bytes.Buffer
	if err := s.WriteSavepoint(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), model
}

func TestIngestSavepoint(t *testing.T) {
	ctx := context.Background()
	fp := Fingerprint{MaxParallelism: 4, Operators: []OperatorInfo{{UID: "opA", Kind: "k"}, {UID: "opB", Kind: "k"}}}
	sp, model := ingestFixture(t, fp)

	dir := filepath.Join(t.TempDir(), "ingested")
	// Small tables: several ingests, each placed below the others.
	if err := ingestSavepoint(ctx, dir, bytes.NewReader(sp), Options{Fingerprint: fp}, ingestConfig{tableBytes: 4 << 10}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir, Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	if got := readContent(t, r); !sameContent(got, model) {
		t.Fatalf("ingested: %s", diffContent(got, model))
	}
	if m, _ := r.Latest(); !m.Savepoint || m.ID != model.ID || len(r.History()) != 1 {
		t.Fatalf("ingested metadata %+v, history %d", m, len(r.History()))
	}
	lv := r.db.Metrics().Levels
	if lv[6].TablesCount < 2 || lv[0].TablesCount > 1 {
		t.Fatalf("tables per level: L0 %d, L6 %d; want the state's tables in L6", lv[0].TablesCount, lv[6].TablesCount)
	}
	// It goes on committing.
	if _, err := r.Commit(ctx, &Commit{ID: model.ID + 1}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if err := IngestSavepoint(ctx, dir, bytes.NewReader(sp), Options{Fingerprint: fp}); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("ingest into a store with checkpoints: %v", err)
	}
	// Another job's savepoint is refused.
	other := Fingerprint{MaxParallelism: 8}
	if err := IngestSavepoint(ctx, filepath.Join(t.TempDir(), "fp"), bytes.NewReader(sp), Options{Fingerprint: other}); !errors.Is(err, ErrFingerprintMismatch) {
		t.Fatalf("other fingerprint: %v", err)
	}

	// An interrupted ingest (the stream cut short after some tables went
	// in) leaves a store that Open refuses; the next ingest into the same
	// directory replaces what it left.
	cut := filepath.Join(t.TempDir(), "cut")
	err = ingestSavepoint(ctx, cut, bytes.NewReader(sp[:len(sp)*3/4]), Options{Fingerprint: fp}, ingestConfig{tableBytes: 4 << 10})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated savepoint: %v", err)
	}
	if _, err := Open(cut, Options{Fingerprint: fp}); !errors.Is(err, ErrIncompleteRestore) {
		t.Fatalf("open after an interrupted ingest: %v", err)
	}
	if err := IngestSavepoint(ctx, cut, bytes.NewReader(sp), Options{Fingerprint: fp}); err != nil {
		t.Fatal(err)
	}
	r, err = Open(cut, Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := readContent(t, r); !sameContent(got, model) {
		t.Fatalf("ingested after an interrupted ingest: %s", diffContent(got, model))
	}
}

// TestIngestSavepointUnordered: records out of key order (and a repeated
// key) restore as RestoreSavepoint restores them: the later record wins.
func TestIngestSavepointUnordered(t *testing.T) {
	ctx := context.Background()
	var buf bytes.Buffer
	sw := &savepointWriter{w: bufio.NewWriter(&buf)}
	mb, _ := json.Marshal(Metadata{ID: 7})
	hdr := append([]byte(savepointMagic), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(hdr[8:], FormatVersion)
	binary.BigEndian.PutUint32(hdr[12:], uint32(len(mb)))
	hdr = append(hdr, mb...)
	hdr = binary.BigEndian.AppendUint32(hdr, crc32.Checksum(hdr, castagnoli))
	_, _ = sw.w.Write(hdr)
	for _, kv := range [][2]string{{"k5", "a"}, {"k9", "b"}, {"k1", "c"}, {"k5", "d"}, {"k2", "e"}, {"k2", "f"}} {
		if err := sw.record(&savepointRecord{typ: recState, uid: []byte("op"), keyGroup: 1, key: []byte(kv[0]), value: []byte(kv[1])}); err != nil {
			t.Fatal(err)
		}
	}
	_ = sw.record(&savepointRecord{typ: recOffset, key: []byte("split"), value: []byte("42")})
	_ = sw.record(&savepointRecord{typ: recEnd})
	if err := sw.w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := emptyContent()
	want.ID = 7
	want.Offsets["split"] = "42"
	for k, v := range map[string]string{"k1": "c", "k2": "f", "k5": "d", "k9": "b"} {
		want.State[stateID("op", 1, k)] = v
	}
	for name, restore := range map[string]func(string) error{
		"batches": func(dir string) error { return RestoreSavepoint(ctx, dir, bytes.NewReader(buf.Bytes()), Options{}) },
		"ingest":  func(dir string) error { return IngestSavepoint(ctx, dir, bytes.NewReader(buf.Bytes()), Options{}) },
	} {
		dir := filepath.Join(t.TempDir(), name)
		if err := restore(dir); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := readContent(t, s)
		s.Close()
		if !sameContent(got, want) {
			t.Fatalf("%s: %s", name, diffContent(got, want))
		}
	}
}

// TestIngestSavepointCrash crashes an ingest before every filesystem write
// (keeping a random share of unsynced data) and opens every crash image:
// each must be refused (ErrIncompleteRestore), hold no checkpoint (the
// crash came before the marker), or hold the whole savepoint. Its control,
// which publishes the checkpoint before ingesting the tables, must fail.
func TestIngestSavepointCrash(t *testing.T) {
	fp := Fingerprint{MaxParallelism: 4, Operators: []OperatorInfo{{UID: "opA", Kind: "k"}, {UID: "opB", Kind: "k"}}}
	sp, model := ingestFixture(t, fp)
	for _, tc := range []struct {
		name    string
		order   ingestOrder
		control bool
	}{{"real", ingestInOrder, false}, {"control=publish-first", ingestLatestFirst, true}} {
		t.Run(tc.name, func(t *testing.T) {
			err := ingestCrashRun(t, rand.New(rand.NewPCG(seed(t), 7)), sp, model, fp, tc.order)
			if tc.control {
				if err == nil {
					t.Fatal("control: no crash image showed a partial restore taken for a checkpoint")
				}
				t.Logf("control failed as it must: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func ingestCrashRun(t *testing.T, rng *rand.Rand, sp []byte, model content, fp Fingerprint, order ingestOrder) error {
	mem := vfs.NewCrashableMem()
	var (
		mu     sync.Mutex
		clones []*vfs.MemFS
		armed  bool
	)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() != errorfs.OpIsWrite {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		// Crash points start at the ingest's first write-ahead log write
		// (its restore marker): before it, Pebble is opening (creating) the
		// store, whose crashes are Pebble's to survive, not the ingest's
		// (this crashable file system can leave an opened store without
		// the manifest its marker names).
		if !armed {
			if op.Kind != errorfs.OpFileWrite || !strings.HasSuffix(op.Path, ".log") {
				return nil
			}
			armed = true
		}
		pct := []int{0, 50, 100}[rng.IntN(3)]
		clones = append(clones, mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(rng.Uint64(), 1))}))
		return nil
	})
	opts := Options{Fingerprint: fp, FS: storefs.New(errorfs.Wrap(mem, inj)), MemTableSize: 256 << 10}
	if err := ingestSavepoint(context.Background(), "db", bytes.NewReader(sp), opts, ingestConfig{order: order, tableBytes: 4 << 10}); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d crash points", len(clones))
	var refused, empty, whole int
	for i, fs := range clones {
		s, err := Open("db", Options{Fingerprint: fp, FS: storefs.New(fs)})
		if errors.Is(err, ErrIncompleteRestore) {
			refused++
			continue
		}
		if err != nil {
			return errors.Join(errors.New("reopen after crash "+itoa(i)), err)
		}
		got := readContent(t, s)
		_, ok := s.Latest()
		s.Close()
		switch {
		case !ok && sameContent(got, emptyContent()):
			empty++
		case sameContent(got, model):
			whole++
		default:
			return &crashViolation{clone: i, diff: diffContent(got, model)}
		}
	}
	t.Logf("crash images: %d refused, %d empty, %d whole", refused, empty, whole)
	if refused == 0 || whole == 0 {
		return errors.New("the crash points missed the ingest (no refused or no whole image)")
	}
	return nil
}
