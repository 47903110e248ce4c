package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// BenchmarkSavepointLoad loads a savepoint of 100k keys of 1 KiB of
// incompressible state (about 100 MiB, scale-out's hand-off benchmark's
// shape) into a new store: method=batches is RestoreSavepoint (batches
// through the write-ahead log and memtables), method=ingest is
// IngestSavepoint (sstables ingested). MB/s is savepoint bytes per second.
func BenchmarkSavepointLoad(b *testing.B) {
	ctx := context.Background()
	const keys, valueSize = 100_000, 1 << 10
	src, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, valueSize)
	for from := 0; from < keys; from += 10_000 {
		p := &testPart{}
		for k := from; k < from+10_000; k++ {
			for i := range val {
				val[i] = byte(rng.Uint32())
			}
			p.ops = append(p.ops, op{kind: 'p', uid: "op", kg: uint16(k % 128), key: string(binary.BigEndian.AppendUint64(nil, uint64(k))), val: string(val)})
		}
		if _, err := src.Commit(ctx, &Commit{ID: uint64(from/10_000 + 1), Parts: []Part{p}}); err != nil {
			b.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := src.WriteSavepoint(ctx, &buf); err != nil {
		b.Fatal(err)
	}
	_ = src.Close()
	sp := buf.Bytes()
	b.ResetTimer()
	for _, m := range []struct {
		name string
		load func(dir string) error
	}{
		{"batches", func(dir string) error { return RestoreSavepoint(ctx, dir, bytes.NewReader(sp), Options{}) }},
		{"ingest", func(dir string) error { return IngestSavepoint(ctx, dir, bytes.NewReader(sp), Options{}) }},
	} {
		b.Run("method="+m.name, func(b *testing.B) {
			b.SetBytes(int64(len(sp)))
			for i := range b.N {
				if err := m.load(filepath.Join(b.TempDir(), fmt.Sprint(i))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
