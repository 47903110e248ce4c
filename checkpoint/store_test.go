package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// op is one state change of a testPart.
type op struct {
	kind     byte // 'p' put, 'd' delete, 'r' range delete
	uid      string
	kg       uint16
	key, val string // for 'r': key=from, val=to
}

type testPart struct{ ops []op }

func (p *testPart) WriteTo(w *Writer) error {
	for _, o := range p.ops {
		var err error
		switch o.kind {
		case 'p':
			err = w.PutState(o.uid, o.kg, []byte(o.key), []byte(o.val))
		case 'd':
			err = w.DeleteState(o.uid, o.kg, []byte(o.key))
		case 'r':
			err = w.DeleteStateRange(o.uid, o.kg, []byte(o.key), []byte(o.val))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// content is everything a checkpoint determines.
type content struct {
	ID      uint64
	Offsets map[string]string
	State   map[string]string // uid \x00 kg \x00 key
	Pending map[string]string // sink/subtask/id
}

func (c content) clone() content {
	return content{ID: c.ID, Offsets: maps.Clone(c.Offsets), State: maps.Clone(c.State), Pending: maps.Clone(c.Pending)}
}

func stateID(uid string, kg uint16, key string) string {
	return fmt.Sprintf("%s\x00%d\x00%s", uid, kg, key)
}
func pendingID(p PendingCommit) string {
	return fmt.Sprintf("%s/%d/%d", p.SinkUID, p.Subtask, p.CheckpointID)
}

func (c *content) apply(cm *Commit) {
	c.ID = cm.ID
	for k, v := range cm.Offsets {
		if v == nil {
			delete(c.Offsets, k)
		} else {
			c.Offsets[k] = string(v)
		}
	}
	for _, p := range cm.Resolved {
		delete(c.Pending, pendingID(p))
	}
	for _, p := range cm.Pending {
		c.Pending[pendingID(p)] = string(p.Data)
	}
	for _, part := range cm.Parts {
		for _, o := range part.(*testPart).ops {
			switch o.kind {
			case 'p':
				c.State[stateID(o.uid, o.kg, o.key)] = o.val
			case 'd':
				delete(c.State, stateID(o.uid, o.kg, o.key))
			case 'r':
				for k := range c.State {
					pre := stateID(o.uid, o.kg, "")
					if rest, ok := strings.CutPrefix(k, pre); ok && rest >= o.key && rest < o.val {
						delete(c.State, k)
					}
				}
			}
		}
	}
}

func emptyContent() content {
	return content{Offsets: map[string]string{}, State: map[string]string{}, Pending: map[string]string{}}
}

// readContent reads a store's latest checkpoint through the public API
// (state through a raw scan of the state family).
func readContent(t testing.TB, s *Store) content {
	t.Helper()
	c := emptyContent()
	if m, ok := s.Latest(); ok {
		c.ID = m.ID
	}
	offs, err := s.Offsets()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range offs {
		c.Offsets[k] = string(v)
	}
	pend, err := s.PendingCommits()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pend {
		c.Pending[pendingID(p)] = string(p.Data)
	}
	err = s.scan(s.db, []byte{famState}, []byte{famEnd}, func(k, v []byte) error {
		uid, kg, key, err := parseStateKey(k)
		if err != nil {
			return err
		}
		c.State[stateID(string(uid), kg, string(key))] = string(v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sameContent(a, b content) bool {
	return a.ID == b.ID && maps.Equal(a.Offsets, b.Offsets) && maps.Equal(a.State, b.State) && maps.Equal(a.Pending, b.Pending)
}

func diffContent(a, b content) string {
	var out []string
	if a.ID != b.ID {
		out = append(out, fmt.Sprintf("id %d vs %d", a.ID, b.ID))
	}
	for _, m := range []struct {
		name string
		x, y map[string]string
	}{{"offsets", a.Offsets, b.Offsets}, {"state", a.State, b.State}, {"pending", a.Pending, b.Pending}} {
		for k, v := range m.x {
			if w, ok := m.y[k]; !ok || w != v {
				out = append(out, fmt.Sprintf("%s %q: %q vs %q", m.name, k, v, w))
			}
		}
		for k, w := range m.y {
			if _, ok := m.x[k]; !ok {
				out = append(out, fmt.Sprintf("%s %q: missing vs %q", m.name, k, w))
			}
		}
	}
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("… %d more", len(out)-5))
	}
	return strings.Join(out, "; ")
}

// randomCommit builds commit id with random offsets, state changes and
// pending records; big makes it large enough to span several WAL writes.
func randomCommit(rng *rand.Rand, id uint64, model content, big bool) *Commit {
	c := &Commit{ID: id, Offsets: map[string][]byte{}}
	for i := range 4 {
		if rng.IntN(2) == 0 {
			c.Offsets[SplitKey("src", fmt.Sprint(i))] = binary.BigEndian.AppendUint64(nil, id*100+uint64(i))
		}
	}
	if rng.IntN(5) == 0 && len(model.Offsets) > 0 {
		ks := slices.Sorted(maps.Keys(model.Offsets))
		c.Offsets[ks[rng.IntN(len(ks))]] = nil
	}
	var parts []Part
	for _, uid := range []string{"opA", "opB"} {
		p := &testPart{}
		n := 20 + rng.IntN(40)
		if big {
			n = 3000
		}
		for range n {
			kg := uint16(rng.IntN(4))
			key := fmt.Sprintf("k%03d", rng.IntN(200))
			switch r := rng.IntN(20); {
			case r < 14:
				val := fmt.Sprintf("%s@%d", key, id)
				if big {
					val += strings.Repeat("x", 100)
				}
				p.ops = append(p.ops, op{kind: 'p', uid: uid, kg: kg, key: key, val: val})
			case r < 19:
				p.ops = append(p.ops, op{kind: 'd', uid: uid, kg: kg, key: key})
			default:
				p.ops = append(p.ops, op{kind: 'r', uid: uid, kg: kg, key: "k05", val: "k07"})
			}
		}
		parts = append(parts, p)
	}
	c.Parts = parts
	c.Pending = []PendingCommit{{SinkUID: "sink", Subtask: rng.IntN(2), CheckpointID: id, Data: []byte(fmt.Sprint("tx", id))}}
	for k := range model.Pending {
		if rng.IntN(2) == 0 {
			var p PendingCommit
			fmt.Sscanf(strings.ReplaceAll(k, "/", " "), "%s %d %d", &p.SinkUID, &p.Subtask, &p.CheckpointID)
			c.Resolved = append(c.Resolved, p)
		}
	}
	return c
}

func TestCheckpointCommitRestoreAfterReopen(t *testing.T) {
	dir := t.TempDir()
	fp := Fingerprint{MaxParallelism: 4, Operators: []OperatorInfo{{UID: "opA", Kind: "k", Codecs: "c"}, {UID: "opB", Kind: "k", Codecs: "c"}}}
	s, err := Open(dir, Options{Fingerprint: fp, Retain: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Latest(); ok {
		t.Fatal("new store has a latest checkpoint")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	model := emptyContent()
	for id := uint64(1); id <= 5; id++ {
		c := randomCommit(rng, id*10, model, false)
		m, err := s.Commit(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		model.apply(c)
		if m.ID != id*10 || m.StateChanges == 0 || m.Bytes == 0 || m.FormatVersion != FormatVersion {
			t.Fatalf("metadata %+v", m)
		}
	}
	if got := readContent(t, s); !sameContent(got, model) {
		t.Fatalf("before reopen: %s", diffContent(got, model))
	}
	if _, err := s.Commit(context.Background(), &Commit{ID: 50}); !errors.Is(err, ErrStaleID) {
		t.Fatalf("repeated id: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Offsets(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Offsets after Close: %v", err)
	}
	s, err = Open(dir, Options{Fingerprint: fp, Retain: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := readContent(t, s); !sameContent(got, model) {
		t.Fatalf("after reopen: %s", diffContent(got, model))
	}
	h := s.History()
	if len(h) != 2 || h[0].ID != 50 || h[1].ID != 40 {
		t.Fatalf("history %+v", h)
	}
	// GetState / ScanState on the committed data.
	for k, v := range model.State {
		parts := strings.SplitN(k, "\x00", 3)
		var kg uint16
		fmt.Sscan(parts[1], &kg)
		got, ok, err := s.GetState(parts[0], kg, []byte(parts[2]))
		if err != nil || !ok || string(got) != v {
			t.Fatalf("GetState %q = %q %v %v, want %q", k, got, ok, err, v)
		}
		break
	}
	n := 0
	var last []byte
	if err := s.ScanState("opA", 1, []byte("k"), func(k, v []byte) bool {
		if last != nil && bytes.Compare(last, k) >= 0 {
			t.Fatalf("scan out of order: %q after %q", k, last)
		}
		last = append(last[:0], k...)
		n++
		return true
	}); err != nil {
		t.Fatal(err)
	}
	want := 0
	for k := range model.State {
		if strings.HasPrefix(k, stateID("opA", 1, "k")) {
			want++
		}
	}
	if n != want {
		t.Fatalf("ScanState saw %d entries, want %d", n, want)
	}
}

func TestCheckpointFingerprintMismatch(t *testing.T) {
	dir := t.TempDir()
	fp := Fingerprint{MaxParallelism: 8, Operators: []OperatorInfo{
		{UID: "count", Kind: "keyed", Codecs: "n:value=int64be"},
		{UID: "gone", Kind: "keyed", Codecs: "x"},
		{UID: "stateless", Kind: "map"},
	}}
	s, err := Open(dir, Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	p := &testPart{ops: []op{{kind: 'p', uid: "count", kg: 3, key: "a", val: "1"}, {kind: 'p', uid: "gone", kg: 7, key: "b", val: "2"}}}
	if _, err := s.Commit(context.Background(), &Commit{ID: 1, Parts: []Part{p}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		fp     Fingerprint
		wantOK bool
		names  []string
	}{
		{"same", fp, true, nil},
		{"zero skips the check", Fingerprint{}, true, nil},
		{"new operator and stateless dropped", Fingerprint{MaxParallelism: 8, Operators: []OperatorInfo{fp.Operators[0], fp.Operators[1], {UID: "new", Kind: "k"}}}, true, nil},
		{"codec changed", Fingerprint{MaxParallelism: 8, Operators: []OperatorInfo{{UID: "count", Kind: "keyed", Codecs: "n:value=varint"}, fp.Operators[1]}}, false, []string{`"count"`, "codecs"}},
		{"stateful operator removed", Fingerprint{MaxParallelism: 8, Operators: []OperatorInfo{fp.Operators[0]}}, false, []string{`"gone"`, "not in the job"}},
		{"parallelism", Fingerprint{MaxParallelism: 16, Operators: fp.Operators}, false, []string{"max parallelism 8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(dir, Options{Fingerprint: tc.fp})
			if tc.wantOK {
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				return
			}
			if !errors.Is(err, ErrFingerprintMismatch) {
				t.Fatalf("err = %v, want ErrFingerprintMismatch", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Fatalf("error %q does not name %s", err, n)
				}
			}
		})
	}
}

func TestCheckpointFormatVersion(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Pretend an older build wrote the store: Open ratchets it forward.
	if err := s.db.Set(keyFormat, binary.BigEndian.AppendUint32(nil, 0), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("older format: %v", err)
	}
	v, _, _ := s.get(keyFormat)
	if binary.BigEndian.Uint32(v) != FormatVersion {
		t.Fatalf("format not ratcheted: %x", v)
	}
	// A newer build's store is refused.
	if err := s.db.Set(keyFormat, binary.BigEndian.AppendUint32(nil, FormatVersion+1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrFormatTooNew) {
		t.Fatalf("newer format: %v", err)
	}
}

func TestCheckpointInvalidInput(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []*Commit{
		{ID: 1, Parts: []Part{&testPart{ops: []op{{kind: 'p', uid: "", key: "k"}}}}},
		{ID: 1, Parts: []Part{&testPart{ops: []op{{kind: 'p', uid: "u", key: strings.Repeat("k", MaxKeyLen+1)}}}}},
		{ID: 1, Pending: []PendingCommit{{SinkUID: "", CheckpointID: 1}}},
		{ID: 1, Pending: []PendingCommit{{SinkUID: "s", Subtask: -1}}},
		{ID: 1, Offsets: map[string][]byte{"": {1}}},
	} {
		if _, err := s.Commit(context.Background(), c); !errors.Is(err, ErrInvalid) {
			t.Fatalf("commit %+v: %v", c, err)
		}
	}
	if _, ok := s.Latest(); ok {
		t.Fatal("a failed commit completed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Commit(ctx, &Commit{ID: 1, Parts: []Part{&testPart{}}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

func TestCheckpointSavepointRoundTrip(t *testing.T) {
	ctx := context.Background()
	fp := Fingerprint{MaxParallelism: 4, Operators: []OperatorInfo{{UID: "opA", Kind: "k"}, {UID: "opB", Kind: "k"}}}
	s, err := Open(t.TempDir(), Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var buf bytes.Buffer
	if err := s.WriteSavepoint(ctx, &buf); err == nil {
		t.Fatal("savepoint of an empty store")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	model := emptyContent()
	for id := uint64(1); id <= 4; id++ {
		c := randomCommit(rng, id, model, id == 2)
		if _, err := s.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
		model.apply(c)
	}
	if err := s.WriteSavepoint(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	sp := buf.Bytes()

	// Plain restore.
	dir := filepath.Join(t.TempDir(), "restored")
	if err := RestoreSavepoint(ctx, dir, bytes.NewReader(sp), Options{Fingerprint: fp}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir, Options{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	if got := readContent(t, r); !sameContent(got, model) {
		t.Fatalf("restored: %s", diffContent(got, model))
	}
	if m, _ := r.Latest(); !m.Savepoint {
		t.Fatalf("restored metadata %+v", m)
	}
	// Restoring into a store with checkpoints is refused.
	r.Close()
	if err := RestoreSavepoint(ctx, dir, bytes.NewReader(sp), Options{Fingerprint: fp}); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("restore into non-empty: %v", err)
	}

	// A job without opB: refused, then restored dropping opB's state.
	fp2 := Fingerprint{MaxParallelism: 4, Operators: []OperatorInfo{{UID: "opA", Kind: "k"}}}
	dir2 := filepath.Join(t.TempDir(), "dropped")
	err = RestoreSavepoint(ctx, dir2, bytes.NewReader(sp), Options{Fingerprint: fp2})
	if !errors.Is(err, ErrFingerprintMismatch) || !strings.Contains(err.Error(), `"opB"`) {
		t.Fatalf("mismatch: %v", err)
	}
	if err := RestoreSavepoint(ctx, dir2, bytes.NewReader(sp), Options{Fingerprint: fp2}, "opB"); err != nil {
		t.Fatal(err)
	}
	r, err = Open(dir2, Options{Fingerprint: fp2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := model.clone()
	for k := range want.State {
		if strings.HasPrefix(k, "opB\x00") {
			delete(want.State, k)
		}
	}
	if got := readContent(t, r); !sameContent(got, want) {
		t.Fatalf("restored with drop: %s", diffContent(got, want))
	}
	// The restored store goes on committing.
	if _, err := r.Commit(ctx, &Commit{ID: 5}); err != nil {
		t.Fatal(err)
	}

	// Every truncation and every single-byte corruption is an error.
	for _, n := range []int{0, 5, 20, len(sp) / 2, len(sp) - 1} {
		err := RestoreSavepoint(ctx, filepath.Join(t.TempDir(), "t"), bytes.NewReader(sp[:n]), Options{})
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated at %d: %v", n, err)
		}
	}
	for i := 0; i < len(sp); i += 1 + len(sp)/50 {
		bad := slices.Clone(sp)
		bad[i] ^= 0x40
		err := RestoreSavepoint(ctx, filepath.Join(t.TempDir(), "c"), bytes.NewReader(bad), Options{})
		if err == nil {
			t.Fatalf("corruption at byte %d accepted", i)
		}
	}
	// A newer format is refused with a clear error.
	newer := slices.Clone(sp)
	binary.BigEndian.PutUint32(newer[8:], FormatVersion+1)
	if err := RestoreSavepoint(ctx, filepath.Join(t.TempDir(), "n"), bytes.NewReader(newer), Options{}); !errors.Is(err, ErrFormatTooNew) {
		t.Fatalf("newer savepoint: %v", err)
	}
}

func TestCheckpointInterruptedRestore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(keyRestoring, nil, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrIncompleteRestore) {
		t.Fatalf("open after interrupted restore: %v", err)
	}
}
