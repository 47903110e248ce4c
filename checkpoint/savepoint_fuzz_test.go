package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

// FuzzSavepointDecode feeds arbitrary bytes, whole and in 1-byte reads, to
// the savepoint decoder. Invariants: it never panics, never allocates
// beyond the stated bounds (a length is checked before its buffer is
// made), and every failure is ErrCorrupt or ErrFormatTooNew; a stream that
// decodes completely ends with a correct end record.
func FuzzSavepointDecode(f *testing.F) {
	s, err := Open(f.TempDir(), Options{})
	if err != nil {
		f.Fatal(err)
	}
	p := &testPart{ops: []op{{kind: 'p', uid: "u", kg: 3, key: "k", val: "v"}}}
	if _, err := s.Commit(context.Background(), &Commit{ID: 7, Offsets: map[string][]byte{"s\x000": {1}},
		Pending: []PendingCommit{{SinkUID: "sink", Subtask: 1, CheckpointID: 7, Data: []byte("tx")}}, Parts: []Part{p}}); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.WriteSavepoint(context.Background(), &buf); err != nil {
		f.Fatal(err)
	}
	s.Close()
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:40])
	f.Add([]byte(savepointMagic + "\x00\x00\x00\x01\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, r := range []io.Reader{bytes.NewReader(data), &oneByteReader{data}} {
			sr, _, err := readSavepointHeader(bufio.NewReaderSize(r, 16))
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrFormatTooNew) {
					t.Fatalf("header error %v", err)
				}
				continue
			}
			var rec savepointRecord
			for {
				err := sr.next(&rec)
				if errors.Is(err, io.EOF) {
					if !sr.done {
						t.Fatal("EOF before the end record")
					}
					break
				}
				if err != nil {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("record error %v", err)
					}
					break
				}
				if len(rec.key) > MaxKeyLen || len(rec.value) > MaxValueLen || len(rec.uid) > MaxUIDLen {
					t.Fatal("field above its bound")
				}
			}
		}
	})
}

type oneByteReader struct{ b []byte }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.b[0]
	r.b = r.b[1:]
	return 1, nil
}
