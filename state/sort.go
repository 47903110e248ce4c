// The order of a snapshot's entries: a checkpoint part writes its keys in
// sorted order (Pebble batches and ingestion want it), and a radix sort on
// the key group and prefix bytes does that faster than a comparison sort.

package state

import (
	"encoding/binary"
	"slices"
	"strings"
)

// sortKey is an entry of a layer to sort: pfx holds the key group and the
// 6 bytes that follow the part every key of the layer shares (big-endian,
// zero-padded), so that most comparisons need no string. The sort may
// overwrite pfx (see sortByKey).
type sortKey struct {
	pfx uint64
	key string
	i   uint32
}

// sortedEntries returns l's entries (those in its index) in key order,
// valid until the next call. It only reads l (but for its sort buffers), so
// it may run while l's owner reads it too.
func sortedEntries(l *layer) []sortKey {
	// lcp: the length of the part after the key group that all keys share.
	first, lcp := "", -1
	for i := range l.ents.len() {
		e := l.ents.at(uint32(i))
		if !e.written() {
			continue
		}
		k := e.key
		if lcp < 0 {
			first, lcp = k[2:], len(k)-2
			continue
		}
		n, j := min(lcp, len(k)-2), 0
		for j < n && k[2+j] == first[j] {
			j++
		}
		lcp = j
	}
	// The sort's buffers stay with the layer (and with the layers that
	// reuse it): only Commits, which are serialised, touch them.
	out := slices.Grow(l.sortBuf[:0], l.ents.len())
	for i := range l.ents.len() {
		e := l.ents.at(uint32(i))
		if !e.written() {
			continue
		}
		out = append(out, sortKey{pfx: groupPfx(e.key, 2+lcp), key: e.key, i: uint32(i)})
	}
	l.sortTmp = slices.Grow(l.sortTmp[:0], len(out))[:len(out)]
	radixSortKeys(out, l.sortTmp)
	l.sortBuf = out
	return out
}

// groupPfx is the sort prefix of layer key k: its key group, then the 6
// bytes of k from at on (zero-padded). Ordering by (groupPfx, k) is k's
// order when the keys share their bytes between the key group and at.
func groupPfx(k string, at int) uint64 {
	var p [8]byte
	p[0], p[1] = k[0], k[1]
	copy(p[2:], k[at:])
	return binary.BigEndian.Uint64(p[:])
}

// radixSortKeys sorts keys by (pfx, key) (tmp is scratch of the same
// length): a least-significant-digit radix sort on the bytes of pfx in
// which the keys differ, then each run of equal pfx by its keys (see
// sortByKey). Small inputs use a comparison sort.
func radixSortKeys(keys, tmp []sortKey) {
	if len(keys) < 256 {
		slices.SortFunc(keys, cmpSortKey)
		return
	}
	radixSortPfx(keys, tmp)
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j].pfx == keys[i].pfx {
			j++
		}
		if j-i > 1 {
			sortByKey(keys[i:j], tmp[i:j], 0)
		}
		i = j
	}
}

func cmpSortKey(a, b sortKey) int {
	if a.pfx != b.pfx {
		if a.pfx < b.pfx {
			return -1
		}
		return 1
	}
	return strings.Compare(a.key, b.key)
}

func cmpKey(a, b sortKey) int { return strings.Compare(a.key, b.key) }

// radixSortPfx sorts keys by pfx (stable), skipping the bytes in which no
// two keys differ.
func radixSortPfx(keys, tmp []sortKey) {
	and, or := ^uint64(0), uint64(0)
	for i := range keys {
		and &= keys[i].pfx
		or |= keys[i].pfx
	}
	diff := and ^ or
	src, dst := keys, tmp[:len(keys)]
	var count [256]int
	for shift := uint(0); shift < 64; shift += 8 {
		if (diff>>shift)&0xff == 0 {
			continue
		}
		clear(count[:])
		for i := range src {
			count[(src[i].pfx>>shift)&0xff]++
		}
		sum := 0
		for d := range count {
			c := count[d]
			count[d] = sum
			sum += c
		}
		for i := range src {
			d := (src[i].pfx >> shift) & 0xff
			dst[count[d]] = src[i]
			count[d]++
		}
		src, dst = dst, src
	}
	if len(src) > 0 && &src[0] != &keys[0] {
		copy(keys, src)
	}
}

// sortByKey sorts keys, which share at least their first from bytes, by
// key: a radix sort on the 8 bytes after the run's common prefix, then the
// same for each run of keys equal in those bytes (a layer whose keys
// belong to several states shares no prefix past the key group, so the
// first pfx leaves long runs).
func sortByKey(keys, tmp []sortKey, from int) {
	if len(keys) < 64 {
		slices.SortFunc(keys, cmpKey)
		return
	}
	first := keys[0].key
	lcp := len(first)
	for i := 1; i < len(keys) && lcp > from; i++ {
		k := keys[i].key
		n, j := min(lcp, len(k)), from
		for j < n && k[j] == first[j] {
			j++
		}
		lcp = j
	}
	if lcp < from {
		lcp = from
	}
	for i := range keys {
		var p [8]byte
		if k := keys[i].key; lcp < len(k) {
			copy(p[:], k[lcp:])
		}
		keys[i].pfx = binary.BigEndian.Uint64(p[:])
	}
	radixSortPfx(keys, tmp)
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j].pfx == keys[i].pfx {
			j++
		}
		switch {
		case j-i < 2:
		case j-i == len(keys):
			// No byte after the prefix told them apart (keys that
			// differ only in trailing zero bytes): compare.
			slices.SortFunc(keys[i:j], cmpKey)
		default:
			sortByKey(keys[i:j], tmp[i:j], lcp+8)
		}
		i = j
	}
}
