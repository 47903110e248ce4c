// The read cache: committed values recently read from Pebble, so that a
// keyed operator reading the same keys again skips the store; merged with
// each committed layer so it never serves a value older than the store's.

package state

// readCache maps layer keys to committed values (ok false: absent). Keys
// and values live in an arena; the whole cache is dropped when it outgrows
// its limit. Only the backend's goroutine uses it.
type readCache struct {
	index map[string]uint32 // key (in the arena) -> ents index
	ents  chunked[cacheEntry]
	arena arena
	bytes int64
	limit int64
	// gen counts resets: a slot (index in ents) names the same key for
	// as long as gen is unchanged, so a layer entry that noted its key's
	// slot (entry.cslot) updates it without a map lookup.
	gen uint32
}

type cacheEntry struct {
	val []byte
	ok  bool
}

// get returns key's cached value.
func (c *readCache) get(key []byte) (val []byte, ok, hit bool) {
	val, ok, _, hit = c.getSlot(key)
	return val, ok, hit
}

// getSlot is get that also returns 1 + key's slot.
func (c *readCache) getSlot(key []byte) (val []byte, ok bool, slot uint32, hit bool) {
	i, hit := c.index[unsafeString(key)]
	if !hit {
		return nil, false, 0, false
	}
	e := c.ents.at(i)
	return e.val, e.ok, i + 1, true
}

func (c *readCache) reset() {
	n := c.ents.len()
	c.index, c.arena, c.bytes = nil, arena{}, 0
	c.ents.reset()
	c.gen++
	if n > 0 {
		c.index = make(map[string]uint32, n)
	}
}

// put records key's committed value (key and val are copied; ok false:
// absent) and returns 1 + its slot (0: not cached).
func (c *readCache) put(key string, val []byte, ok bool) uint32 {
	if c.limit <= 0 {
		return 0
	}
	if i, had := c.index[key]; had {
		c.set(i, val, ok)
		return i + 1
	}
	if c.index == nil || c.bytes > c.limit {
		c.reset()
		if c.index == nil {
			c.index = make(map[string]uint32)
		}
	}
	i := c.ents.add(cacheEntry{val: c.arena.copy(val), ok: ok})
	c.index[unsafeString(c.arena.copy(unsafeBytes(key)))] = i
	c.bytes += int64(len(key)+len(val)) + 64
	return i + 1
}

// set overwrites slot i's value.
func (c *readCache) set(i uint32, val []byte, ok bool) {
	e := c.ents.at(i)
	c.bytes += int64(len(val) - len(e.val))
	if cap(e.val) >= len(val) {
		e.val = e.val[:len(val)]
		copy(e.val, val)
	} else {
		e.val = c.arena.copy(val)
	}
	e.ok = ok
}

// merge applies a committed layer: its puts and deletions become the
// cached values; a range deletion empties the cache first.
func (c *readCache) merge(l *layer) {
	if c.limit <= 0 {
		return
	}
	if len(l.ranges) > 0 {
		c.reset()
	}
	for i := range l.ents.len() {
		e := l.ents.at(uint32(i))
		switch {
		case e.nocache || !e.written():
		case e.cslot != 0 && e.cgen == c.gen && int(e.cslot) <= c.ents.len():
			c.set(e.cslot-1, e.val, !e.del)
		case e.del:
			// Cache a deletion only over a cached value: a key that is
			// not cached reads the store's absence just as well, and
			// deleted keys (a fired window's) are rarely read again.
			if i, had := c.index[e.key]; had {
				c.set(i, nil, false)
			}
		default:
			c.put(e.key, e.val, !e.del)
		}
	}
}
