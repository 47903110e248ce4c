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
	var e *entry
	e, known = b.cur.lookup(key)
	known = known || e != nil
	for i := len(b.frozen) - 1; !known && i >= 0; i-- {
		e, known = b.frozen[i].lookup(key)
		known = known || e != nil
	}
	var val []byte
	switch {
	case known:
		if e == nil || e.del {
			return v, false, true, nil
		}
		val = e.val
	default:
		var hit bool
		if val, ok, hit = b.cache.get(key); !hit {
			return v, false, false, nil
		}
		if !ok {
			return v, false, true, nil
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
