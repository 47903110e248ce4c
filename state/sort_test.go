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
			radixSortKeys(keys, make([]sortKey, len(keys)))
			for i := range keys {
				if keys[i].pfx != want[i].pfx || keys[i].key != want[i].key {
					t.Fatalf("n=%d bits=%d: at %d got (%x, %q), want (%x, %q)", n, pfxBits, i, keys[i].pfx, keys[i].key, want[i].pfx, want[i].key)
				}
			}
		}
	}
}
