package state

import "fmt"

// GetBuffered is Get as far as memory knows: it looks at the write-back
// layers and the cache of committed values, never the store. known false
// means that only the store could tell (v and ok are then zero). It lets a
// caller that can tell absence another way (the window operator, from its
// timers) skip the store read for entries that do not exist, without asking
// that other way for entries that memory has.
func (m *Map[K, V]) GetBuffered(k K) (v V, ok, known bool, err error) {
	key, err := m.entryKey(k)
	if err != nil {
		return v, false, false, err
	}
	val, ok, known := m.h.b.getMem(key)
	if !known {
		m.h.b.cur.noteMiss(key, 0, 0, false) // a Put after it inserts at once
		return v, false, false, nil
	}
	if !ok {
		return v, false, true, nil
	}
	if val, ok, err = m.h.strip(key, val); err != nil || !ok {
		return v, false, true, err
	}
	v, err = m.decode(val)
	return v, err == nil, true, err
}

// KnownAbsent tells the backend that the entry of the last GetBuffered,
// which reported known false, has no value (the caller learnt it another
// way, as the window operator does from its timers). A Put of that entry
// then creates it fresh: if it is deleted again before the next Snapshot,
// the checkpoint neither writes nor caches anything for it. It has no
// effect unless it directly follows such a GetBuffered; telling it of an
// entry that has a value loses that value's deletion.
func (m *Map[K, V]) KnownAbsent() {
	if l := m.h.b.cur; l.missOK {
		l.missAbsent = true
	}
}

// Entries calls fn with the user key and the map key of every entry of the
// map in keyGroup (any user key, not only the current one: the layers
// merged over the store), in stored-key order, until fn returns false or an
// error. key is valid only during the call; fn must not modify state. The
// window operator rebuilds its in-memory index of windows by end from it
// when it starts (see its group timers).
func (m *Map[K, V]) Entries(keyGroup uint16, fn func(key []byte, k K) (bool, error)) error {
	return m.h.scanEntries(keyGroup, func(key, mk []byte) (bool, error) {
		k, err := m.kc.Decode(mk)
		if err != nil {
			return false, fmt.Errorf("state: %s: key: %w", m.h.name, err)
		}
		return fn(key, k)
	})
}
