package store

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
)

// TestOpenSnappyTables opens a store whose tables an earlier version wrote
// with Snappy (Pebble's default block compression) with the current
// options (no compression): every message and key stays readable, new
// tables are uncompressed, and a compaction rewrites the old ones
// uncompressed without losing anything.
func TestOpenSnappyTables(t *testing.T) {
	dir := t.TempDir()
	po := &pebble.Options{}
	for i := range po.Levels {
		po.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.SnappyCompression }
	}
	body := func(i int) string { return fmt.Sprintf("%05d %s", i, strings.Repeat("compressible order text ", 20)) }
	s := openTest(t, dir, Options{PebbleOptions: po})
	const n = 400
	for i := range n / 2 {
		mustPut(t, s, msg("T", int32(i%2), body(i), fmt.Sprintf("k%d", i)))
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if m := s.db.Metrics().Table; m.CompressedCountSnappy == 0 || m.CompressedCountNone != 0 {
		t.Fatalf("old version's tables: %d Snappy, %d uncompressed; want only Snappy", m.CompressedCountSnappy, m.CompressedCountNone)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	check := func(s *Store) {
		t.Helper()
		seen := 0
		for q := range int32(2) {
			for j, rec := range getAll(t, s, "T", q, 0) {
				if want := body(2*j + int(q)); !bytes.Equal(recordBody(rec), []byte(want)) {
					t.Fatalf("queue %d offset %d: body %q, want %q", q, j, recordBody(rec), want)
				}
				seen++
			}
		}
		if seen != n {
			t.Fatalf("read %d messages, want %d", seen, n)
		}
		for _, i := range []int{0, n/2 - 1, n / 2, n - 1} {
			recs, err := s.QueryByKey("T", fmt.Sprintf("k%d", i), 4, 0, 1<<62)
			if err != nil || len(recs) != 1 || !bytes.Equal(recordBody(recs[0]), []byte(body(i))) {
				t.Fatalf("QueryByKey k%d: %d records, %v", i, len(recs), err)
			}
		}
	}
	s = openTest(t, dir, Options{})
	for i := n / 2; i < n; i++ {
		mustPut(t, s, msg("T", int32(i%2), body(i), fmt.Sprintf("k%d", i)))
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if m := s.db.Metrics().Table; m.CompressedCountSnappy == 0 || m.CompressedCountNone == 0 {
		t.Fatalf("after a flush: %d Snappy, %d uncompressed tables; want both", m.CompressedCountSnappy, m.CompressedCountNone)
	}
	check(s)
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	if m := s.db.Metrics().Table; m.CompressedCountSnappy != 0 || m.CompressedCountNone == 0 {
		t.Fatalf("after a compaction: %d Snappy, %d uncompressed tables; want only uncompressed", m.CompressedCountSnappy, m.CompressedCountNone)
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, Options{})
	defer s.Close()
	check(s)
}
