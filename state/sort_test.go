package state

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestRadixSortKeys checks the checkpoint's key sort against a comparison
// sort: keys with few and many differing pfx bytes, and runs of equal pfx
// that only the full keys order.
func TestRadixSortKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 255, 256, 1000, 20000} {
		for _, pfxBits := range []uint{4, 16, 64} {
			keys := make([]sortKey, n)
			for i := range keys {
				var k strings.Builder
				for range 1 + r.IntN(6) {
					k.WriteByte(byte('a' + r.IntN(3)))
				}
				keys[i] = sortKey{pfx: r.Uint64() >> (64 - pfxBits), key: k.String(), i: uint32(i)}
			}
			want := slices.Clone(keys)
			slices.SortStableFunc(want, func(a, b sortKey) int {
				if a.pfx != b.pfx {
					if a.pfx < b.pfx {
						return -1
					}
					return 1
				}
				return strings.Compare(a.key, b.key)
			})
			pfx := make([]uint64, n) // the sort may overwrite pfx
			for i := range keys {
				pfx[keys[i].i] = keys[i].pfx
			}
			radixSortKeys(keys, make([]sortKey, len(keys)))
			for i := range keys {
				if p := pfx[keys[i].i]; p != want[i].pfx || keys[i].key != want[i].key {
					t.Fatalf("n=%d bits=%d: at %d got (%x, %q), want (%x, %q)", n, pfxBits, i, p, keys[i].key, want[i].pfx, want[i].key)
				}
			}
		}
	}
}

// TestSortedEntries checks the checkpoint's order of a layer whose keys
// belong to several states (no shared prefix past the key group), with
// keys that differ only in trailing zero bytes and deep shared prefixes.
func TestSortedEntries(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	l := newLayer(0)
	want := map[string]bool{}
	put := func(k []byte) {
		l.put(k, []byte{1})
		want[string(k)] = true
	}
	for i := range 30000 {
		kg := byte(r.IntN(4))
		k := []byte{0, kg, 1, 'n', 8}
		k = append(k, 0, 0, 0, 0, 0, byte(i>>16), byte(i>>8), byte(i))
		put(k)
		if i%7 == 0 {
			put(append([]byte{0, kg, 9}, "runnel.wm"...))
		}
		if i%5 == 0 {
			long := append([]byte{0, kg, 2, 'l', 'x'}, make([]byte, 20+r.IntN(4))...)
			long[len(long)-1] = byte(r.IntN(3))
			put(long)
		}
	}
	// A range deletion leaves entries out of the index: they must not be written.
	l.deleteRange([]byte{0, 3, 1}, []byte{0, 3, 2})
	for k := range want {
		if k >= string([]byte{0, 3, 1}) && k < string([]byte{0, 3, 2}) {
			delete(want, k)
		}
	}
	got := sortedEntries(l)
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i, sk := range got {
		if !want[sk.key] || l.ents.at(sk.i).key != sk.key {
			t.Fatalf("entry %d %q: not a live key of the layer", i, sk.key)
		}
		if i > 0 && got[i-1].key >= sk.key {
			t.Fatalf("entries %d and %d out of order: %q, %q", i-1, i, got[i-1].key, sk.key)
		}
	}
}
