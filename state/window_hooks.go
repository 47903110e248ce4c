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
	b := m.h.b
	e, masked := b.cur.lookup(key)
	known = masked || e != nil
	inCur := known
	for i := len(b.frozen) - 1; !known && i >= 0; i-- {
		e, masked = b.frozen[i].lookup(key)
		known = masked || e != nil
	}
	var val []byte
	switch {
	case known:
		if !inCur {
			b.cur.noteMiss(key, 0, 0) // as Backend.get: a Put then inserts at once
		}
		if e == nil || e.del {
			return v, false, true, nil
		}
		val = e.val
	default:
		var slot uint32
		val, ok, slot, known = b.cache.getSlot(key)
		b.cur.noteMiss(key, slot, b.cache.gen)
		if !known || !ok {
			return v, false, known, nil
		}
	}
	if val, ok, err = m.h.strip(key, val); err != nil || !ok {
		return v, false, true, err
	}
	if v, err = m.vc.Decode(val); err != nil {
		return v, false, true, fmt.Errorf("state: %s: %w", m.h.name, err)
	}
	return v, true, true, nil
}
