package state

import (
	"hash/maphash"
	"slices"
	"sort"
	"unsafe"
)

// A layer is one generation of the write-back buffer: the changes made
// between two Snapshots. Keys are "layer keys": keyGroup(2 BE) | state key.
// The current layer is mutable (owned by the backend's goroutine); a frozen
// layer is never mutated again except for its lazily built sort caches
// (which Part.WriteTo does not read).
type layer struct {
	id    uint64   // snapshot id once frozen
	index keyIndex // key -> ents index; keys live in the arena
	ents  chunked[entry]
	// memo is the index in ents of the entry last found or inserted (-1:
	// none): a handle's Get then Set of the same key costs one index lookup.
	// Only the backend's goroutine reads or writes it.
	memo int32
	// miss is the key of the backend's last read that this layer did not
	// have (valid while missOK; insert clears it), with where the read
	// cache holds the key (missSlot/missGen, see entry.cslot): a Get then
	// Set of a key new to the layer costs one index lookup, and Committed
	// updates the cached value without another. Only the backend's
	// goroutine uses it, and only on the current layer.
	miss     []byte
	missOK   bool
	missSlot uint32
	missGen  uint32
	// missAbsent: the noted miss is known to be absent below this layer
	// (no older layer, cache or store has a value for it), so the entry a
	// put then inserts is fresh.
	missAbsent bool
	// ranges are range deletions as sorted, non-overlapping [from, to)
	// layer-key intervals; they mask older layers and the store. A key put
	// after a range deletion is in index and wins over the range.
	ranges []keyRange
	arena  arena
	bytes  int64

	// Sort caches for ordered iteration: sorted is an immutable sorted run
	// of the keys of ents[:tailFrom]; the tail, ents[tailFrom:], holds the
	// entries added since (unsorted); tailSorted caches a sorted copy of
	// the tail's keys. Runs may hold keys no longer in index (removed by a
	// range deletion) and duplicates; readers resolve keys through index.
	// (The tail is not kept as a slice of its own: most layers are never
	// iterated in order, and an append per insert cost more than
	// collecting the keys when one is.)
	sorted     []string
	tailFrom   int
	tailSorted []string

	// sortBuf and sortTmp are the checkpoint's sort buffers (see
	// sortedEntries): only the committing goroutine uses them, and reuse
	// keeps them.
	sortBuf, sortTmp []sortKey
}

type entry struct {
	key string // the layer key (in the arena), for the memo check
	val []byte
	del bool
	// gone: a range deletion removed the entry from index (a later put of
	// the key adds a new entry).
	gone bool
	// fresh: when the entry was inserted, the key had no value below this
	// layer (older layers, cache and store all lacked it). A fresh
	// deletion is a no-op for the store and the cache: a Part does not
	// write it and Committed does not cache it, so state created and
	// deleted within one checkpoint interval costs neither a Pebble write
	// nor a cache entry.
	fresh bool
	// nocache: the key is never read through Backend.get (timer keys,
	// which the timer index answers), so Committed does not copy it into
	// the read cache.
	nocache bool
	// cslot is 1 + the key's slot in the backend's read cache when the
	// entry was added, valid while the cache's generation is cgen (0:
	// unknown).
	cslot, cgen uint32
}

type keyRange struct{ from, to string }

// maxLayerHint bounds the number of entries a new layer is sized for.
const maxLayerHint = 1 << 20

// newLayer returns an empty layer sized for about hint entries (the
// previous layer's count: a job tends to change as many keys per
// checkpoint as it did in the last one).
func newLayer(hint int) *layer {
	hint = min(hint, maxLayerHint)
	return &layer{index: newKeyIndex(hint), memo: -1}
}

// reuse empties a committed layer for use as the next current layer,
// keeping its memory (index buckets, entry slices, arena chunks). Nothing
// may still refer to its keys or values.
func (l *layer) reuse() {
	l.index.reset()
	l.ents.reset()
	l.id, l.memo, l.ranges, l.bytes = 0, -1, nil, 0
	l.sorted, l.tailFrom, l.tailSorted = nil, 0, nil
	l.missOK = false
	clear(l.sortBuf)
	clear(l.sortTmp)
	l.arena.reuse()
}

// noteMiss records that key (copied) is not in the layer and where the
// read cache holds it (slot 0: nowhere known); absent says that no level
// below the layer has a value for key.
func (l *layer) noteMiss(key []byte, slot, gen uint32, absent bool) {
	l.miss = append(l.miss[:0], key...)
	l.missOK, l.missSlot, l.missGen, l.missAbsent = true, slot, gen, absent
}

// takeMiss reports whether key is the noted miss (and consumes it), as
// the entry to insert for it (cache slot and freshness set).
func (l *layer) takeMiss(key []byte) (e entry, ok bool) {
	if !l.missOK || string(key) != string(l.miss) {
		return entry{}, false
	}
	l.missOK = false
	return entry{cslot: l.missSlot, cgen: l.missGen, fresh: l.missAbsent}, true
}

// find returns the index in ents of key, if the layer has it.
func (l *layer) find(key []byte) (uint32, bool) {
	if m := l.memo; m >= 0 && l.ents.at(uint32(m)).key == string(key) {
		return uint32(m), true
	}
	i, ok := l.indexFind(unsafeString(key))
	if ok {
		l.memo = int32(i)
	}
	return i, ok
}

// unsafeString views b as a string without copying; the caller guarantees b
// is not modified while the string is in use.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// lookup returns the layer's verdict on key: found (with del saying whether
// it is a deletion) or not known to this layer.
func (l *layer) lookup(key []byte) (e *entry, masked bool) {
	if i, ok := l.find(key); ok {
		return l.ents.at(i), false
	}
	if len(l.ranges) != 0 && l.covered(unsafeString(key)) {
		return nil, true
	}
	return nil, false
}

func (l *layer) covered(k string) bool {
	i := sort.Search(len(l.ranges), func(i int) bool { return l.ranges[i].to > k })
	return i < len(l.ranges) && l.ranges[i].from <= k
}

// put sets key to val (copied). An existing value is overwritten in place
// when it fits.
func (l *layer) put(key, val []byte) {
	if e, ok := l.takeMiss(key); ok {
		e.val = l.arena.copy(val)
		l.insert(key, e)
		return
	}
	if i, ok := l.find(key); ok {
		e := l.ents.at(i)
		if !e.del && cap(e.val) >= len(val) {
			l.bytes += int64(len(val) - len(e.val))
			e.val = e.val[:len(val)]
			copy(e.val, val)
			return
		}
		l.bytes += int64(len(val) - len(e.val))
		e.val, e.del = l.arena.copy(val), false
		return
	}
	l.insert(key, entry{val: l.arena.copy(val)})
}

// appendTo appends extra to key's value, which must be a put in this layer.
func (l *layer) appendTo(key, extra []byte) bool {
	i, ok := l.find(key)
	if !ok || l.ents.at(i).del {
		return false
	}
	e := l.ents.at(i)
	e.val = append(e.val, extra...)
	l.bytes += int64(len(extra))
	return true
}

// del records the deletion of key.
func (l *layer) del(key []byte) {
	if e, ok := l.takeMiss(key); ok {
		e.del = true
		l.insert(key, e)
		return
	}
	if i, ok := l.find(key); ok {
		l.overwrite(i, nil, true)
		return
	}
	l.insert(key, entry{del: true})
}

// overwrite replaces entry i's value (by val, not copied) or makes it a
// deletion.
func (l *layer) overwrite(i uint32, val []byte, del bool) {
	e := l.ents.at(i)
	l.bytes += int64(len(val) - len(e.val))
	e.val, e.del = val, del
}

// putTimer records a timer key (empty value) that the caller knows has no
// value visible: a new entry is fresh. Timer entries are never cached.
func (l *layer) putTimer(key []byte) {
	if i, ok := l.find(key); ok {
		l.overwrite(i, []byte{}, false)
		return
	}
	l.insert(key, entry{val: []byte{}, fresh: true, nocache: true})
}

// delTimer records the deletion of a timer key (see putTimer).
func (l *layer) delTimer(key []byte) {
	if i, ok := l.find(key); ok {
		l.overwrite(i, nil, true)
		return
	}
	l.insert(key, entry{del: true, nocache: true})
}

// appendTimer adds a put of timer key k (kept, not copied: timer keys are
// never modified) without indexing it: Timers.flush adds each key at most
// once, to a layer that has no entry for it, and nothing looks timer keys
// up in a layer. Only a scan would miss it, and timers are scanned only
// when a Timers is created, on a backend without layers.
func (l *layer) appendTimer(k string) {
	l.ents.add(entry{key: k, val: []byte{}, fresh: true, nocache: true})
	l.tailSorted = nil
	l.bytes += int64(len(k)) + 48
}

// written reports whether a Part writes e (and Committed caches it): not
// when a range deletion removed it, nor when it deletes a key that had no
// value below its layer.
func (e *entry) written() bool { return !e.gone && !(e.del && e.fresh) }

func (l *layer) insert(key []byte, e entry) {
	l.missOK = false
	k := unsafeString(l.arena.copy(key))
	e.key = k
	i := l.ents.add(e)
	l.memo = int32(i)
	l.indexAdd(k, i)
	l.tailSorted = nil
	l.bytes += int64(len(key)+len(e.val)) + 48
}

// deleteRange deletes every key in [from, to): this layer's own entries
// are dropped and the range masks older layers.
func (l *layer) deleteRange(from, to []byte) {
	f, t := string(from), string(to)
	l.memo = -1 // its entry may leave the index
	for _, run := range l.runs() {
		lo := sort.SearchStrings(run, f)
		for _, k := range run[lo:] {
			if k >= t {
				break
			}
			if i, ok := l.indexDelete(k); ok {
				l.bytes -= int64(len(l.ents.at(i).val))
				l.ents.at(i).gone = true
			}
		}
	}
	// Insert [f, t) merging overlaps.
	i := sort.Search(len(l.ranges), func(i int) bool { return l.ranges[i].to >= f })
	j := i
	for j < len(l.ranges) && l.ranges[j].from <= t {
		f = min(f, l.ranges[j].from)
		t = max(t, l.ranges[j].to)
		j++
	}
	l.ranges = slices.Replace(l.ranges, i, j, keyRange{f, t})
	l.bytes += int64(len(f) + len(t))
}

// tailKeys returns a new slice of the keys of the entries added since
// sorted was built (the tail), unsorted.
func (l *layer) tailKeys() []string {
	t := make([]string, 0, l.ents.len()-l.tailFrom)
	for i := l.tailFrom; i < l.ents.len(); i++ {
		t = append(t, l.ents.at(uint32(i)).key)
	}
	return t
}

// runs returns the layer's sorted key runs (at most two). The returned
// slices are never modified afterwards.
func (l *layer) runs() [][]string {
	if n := l.ents.len() - l.tailFrom; n > 1024 && n > len(l.sorted)/4 {
		t := l.tailKeys()
		slices.Sort(t)
		merged := make([]string, 0, len(l.sorted)+len(t))
		i, j := 0, 0
		for i < len(l.sorted) && j < len(t) {
			if l.sorted[i] <= t[j] {
				merged = append(merged, l.sorted[i])
				i++
			} else {
				merged = append(merged, t[j])
				j++
			}
		}
		merged = append(append(merged, l.sorted[i:]...), t[j:]...)
		l.sorted, l.tailFrom, l.tailSorted = merged, l.ents.len(), nil
	}
	if l.ents.len() > l.tailFrom && l.tailSorted == nil {
		l.tailSorted = l.tailKeys()
		slices.Sort(l.tailSorted)
	}
	out := make([][]string, 0, 2)
	if len(l.sorted) > 0 {
		out = append(out, l.sorted)
	}
	if len(l.tailSorted) > 0 {
		out = append(out, l.tailSorted)
	}
	return out
}

// arena holds keys and values of one layer in large chunks, so that a put
// costs no allocation of its own. Memory is only reclaimed with the layer
// (or reused, see reuse).
type arena struct {
	chunk  []byte
	chunks [][]byte // every chunk, in order; chunk is chunks[next-1]
	next   int
}

const arenaChunk = 64 << 10

func (a *arena) copy(b []byte) []byte {
	n := len(b)
	if n == 0 {
		return []byte{}
	}
	if n > arenaChunk/8 {
		return append(make([]byte, 0, n), b...)
	}
	if cap(a.chunk)-len(a.chunk) < n {
		if a.next < len(a.chunks) {
			a.chunk = a.chunks[a.next][:0]
		} else {
			a.chunk = make([]byte, 0, arenaChunk)
			a.chunks = append(a.chunks, a.chunk)
		}
		a.next++
	}
	s := len(a.chunk)
	a.chunk = append(a.chunk, b...)
	return a.chunk[s : s+n : s+n]
}

// reuse forgets the arena's contents, keeping its chunks for new ones.
func (a *arena) reuse() {
	a.chunk, a.next = nil, 0
}

// prefixEnd returns the smallest key above every key with prefix p (nil
// when p is all 0xff).
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// chunked is an append-only slice of T in fixed chunks of chunkLen: it
// grows without copying what it holds (a layer or read cache of a million
// entries otherwise copies them again at every growth), and reset keeps
// the chunks for reuse.
type chunked[T any] struct {
	chunks [][]T // each of length chunkLen; chunks[:used] hold elements
	n      int
}

const (
	chunkShift = 10
	chunkLen   = 1 << chunkShift
	chunkMask  = chunkLen - 1
)

// len returns the number of elements.
func (c *chunked[T]) len() int { return c.n }

// at returns element i (i < len).
func (c *chunked[T]) at(i uint32) *T { return &c.chunks[i>>chunkShift][i&chunkMask] }

// add appends x and returns its index.
func (c *chunked[T]) add(x T) uint32 {
	k := c.n >> chunkShift
	if k == len(c.chunks) {
		c.chunks = append(c.chunks, make([]T, chunkLen))
	}
	c.chunks[k][c.n&chunkMask] = x
	c.n++
	return uint32(c.n - 1)
}

// reset empties c, zeroing the elements it held (so their memory can go)
// and keeping its chunks.
func (c *chunked[T]) reset() {
	for k := 0; k<<chunkShift < c.n; k++ {
		clear(c.chunks[k])
	}
	c.n = 0
}

// keyIndex is a layer's index of its entries by key: an open-addressing
// table of 8-byte slots (linear probing, at most half full counting
// deleted slots), each the upper 32 bits of the key's hash (which also
// pick its home slot) and 1 + the entry's index in ents. A lookup reads one
// slot's cache line, then only the entry whose hash matches: a Go map of
// string keys reads a control word, a slot line and the key's bytes in
// separate lines for each probe, and a layer of a checkpoint interval's
// keys is far larger than the CPU caches, so those misses were most of a
// keyed record's state cost. The keys themselves are the entries' (the
// caller resolves a slot to its entry to compare keys).
type keyIndex struct {
	slots []uint64 // 0: empty; low half slotDeleted: deleted
	live  int      // slots holding an entry
	used  int      // live and deleted slots
	seed  maphash.Seed
}

// slotDeleted is the low half of a deleted slot (1 + an index no entry
// has: ents never holds 2^32 - 1 entries).
const slotDeleted = 0xFFFFFFFF

func newKeyIndex(hint int) keyIndex {
	n := 16
	for n < 2*hint {
		n <<= 1
	}
	return keyIndex{slots: make([]uint64, n), seed: maphash.MakeSeed()}
}

func (x *keyIndex) len() int { return x.live }

func (x *keyIndex) hash(key string) uint32 { return uint32(maphash.String(x.seed, key) >> 32) }

// reset empties the index, keeping its slots.
func (x *keyIndex) reset() {
	if x.used > 0 {
		clear(x.slots)
	}
	x.live, x.used = 0, 0
	x.seed = maphash.MakeSeed()
}

// indexFind returns the index in ents of key's entry, if indexed.
func (l *layer) indexFind(key string) (uint32, bool) {
	p, ok := l.indexSlot(key, l.index.hash(key))
	if !ok {
		return 0, false
	}
	return uint32(l.index.slots[p]) - 1, true
}

// indexSlot returns the slot of key (hash h), or the empty slot that ends
// its probe sequence.
func (l *layer) indexSlot(key string, h uint32) (uint32, bool) {
	x := &l.index
	mask := uint32(len(x.slots) - 1)
	for p := h & mask; ; p = (p + 1) & mask {
		s := x.slots[p]
		if s == 0 {
			return p, false
		}
		if uint32(s>>32) == h && uint32(s) != slotDeleted && l.ents.at(uint32(s)-1).key == key {
			return p, true
		}
	}
}

// indexAdd indexes key (an entry's, kept) as entry i, replacing the entry
// it named if any.
func (l *layer) indexAdd(key string, i uint32) {
	x := &l.index
	if (x.used+1)*2 > len(x.slots) {
		l.indexGrow()
	}
	h := x.hash(key)
	p, found := l.indexSlot(key, h)
	x.slots[p] = uint64(h)<<32 | uint64(i+1)
	if !found {
		x.live++
		x.used++
	}
}

// indexDelete unindexes key, returning the entry it named.
func (l *layer) indexDelete(key string) (uint32, bool) {
	p, ok := l.indexSlot(key, l.index.hash(key))
	if !ok {
		return 0, false
	}
	x := &l.index
	i := uint32(x.slots[p]) - 1
	x.slots[p] = x.slots[p]&^0xFFFFFFFF | slotDeleted
	x.live--
	return i, true
}

// indexGrow rehashes the live slots into a table twice as large (or as
// large, when deleted slots fill half of it).
func (l *layer) indexGrow() {
	x := &l.index
	n := len(x.slots)
	if x.live*4 >= n {
		n *= 2
	}
	old := x.slots
	x.slots = make([]uint64, n)
	mask := uint32(n - 1)
	for _, s := range old {
		if s == 0 || uint32(s) == slotDeleted {
			continue
		}
		p := uint32(s>>32) & mask
		for x.slots[p] != 0 {
			p = (p + 1) & mask
		}
		x.slots[p] = s
	}
	x.used = x.live
}
