package state

import (
	"encoding/binary"
	"fmt"
	"iter"
)

// handle is what every state handle shares: the backend, the encoded name
// and a key buffer rebuilt only when the current key changes.
type handle struct {
	b      *Backend
	name   string
	prefix []byte // uvarint(len(name)) | name
	cfg    *stateConfig
	kbuf   []byte
	epoch  uint64
	vbuf   []byte
}

func newHandle(b *Backend, name, kind, codecID string, opts []StateOption) (handle, error) {
	if b == nil {
		return handle{}, fmt.Errorf("%w: nil backend", ErrInvalid)
	}
	cfg := stateConfigOf(opts)
	if cfg.ttl > 0 {
		codecID = "ttl+" + codecID
	}
	prefix, err := b.register(name, kind, codecID, cfg)
	if err != nil {
		return handle{}, err
	}
	if cfg.ttl <= 0 {
		cfg = nil
	}
	return handle{b: b, name: name, prefix: prefix, cfg: cfg}, nil
}

// key returns the layer key of the current key's entry (kg | name | key).
func (h *handle) key() ([]byte, error) {
	if !h.b.hasKey {
		return nil, ErrNoCurrentKey
	}
	if h.epoch != h.b.epoch || len(h.kbuf) == 0 {
		h.kbuf = appendLayerKey(h.kbuf[:0], h.b.kg, h.prefix, h.b.keyPart)
		h.epoch = h.b.epoch
	}
	return h.kbuf, nil
}

// valPrefix starts h.vbuf with the TTL expiry when the state has one.
func (h *handle) valPrefix() []byte {
	h.vbuf = h.vbuf[:0]
	if h.cfg != nil {
		h.vbuf = binary.BigEndian.AppendUint64(h.vbuf, uint64(h.cfg.clock().Add(h.cfg.ttl).UnixNano()))
	}
	return h.vbuf
}

// read returns the payload stored at key (TTL stripped; expired entries
// are deleted and reported absent).
func (h *handle) read(key []byte) ([]byte, bool, error) {
	v, ok, err := h.b.get(key)
	if err != nil || !ok {
		return nil, false, err
	}
	return h.strip(key, v)
}

func (h *handle) strip(key, v []byte) ([]byte, bool, error) {
	if h.cfg == nil {
		return v, true, nil
	}
	if len(v) < 8 {
		return nil, false, fmt.Errorf("%w: %s: TTL value of %d bytes", ErrDecode, h.name, len(v))
	}
	if expired(v, h.cfg) {
		h.b.cur.del(key)
		return nil, false, nil
	}
	return v[8:], true, nil
}

// keys calls fn with each user key that has an entry of this state in kg.
func (h *handle) keys(kg uint16, fn func(key []byte) bool) error {
	var keys [][]byte
	err := h.scanEntries(kg, func(k, _ []byte) (bool, error) {
		if len(keys) == 0 || string(keys[len(keys)-1]) != string(k) {
			keys = append(keys, append([]byte(nil), k...))
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if !fn(k) {
			return nil
		}
	}
	return nil
}

// scanEntries calls fn with the user key and the rest of the stored key
// (what follows the user key: a Map's map key) of every entry of this
// state in kg that has not expired, in stored-key order, until fn returns
// false or an error. Both slices are valid only during the call.
func (h *handle) scanEntries(kg uint16, fn func(key, rest []byte) (bool, error)) error {
	var now int64
	if h.cfg != nil {
		now = h.cfg.clock().UnixNano()
	}
	return h.b.scan(kg, h.prefix, func(sk, val []byte) (bool, error) {
		rest := sk[len(h.prefix):]
		n, w := binary.Uvarint(rest)
		if w <= 0 || uint64(len(rest)-w) < n {
			return false, fmt.Errorf("%w: %s: malformed state key", ErrDecode, h.name)
		}
		if h.cfg != nil && (len(val) < 8 || int64(binary.BigEndian.Uint64(val)) <= now) {
			return true, nil
		}
		return fn(rest[w:w+int(n)], rest[w+int(n):])
	})
}

// Value is a single value per key. Not safe for concurrent use (see Backend).
type Value[T any] struct {
	h     handle
	codec Codec[T]
}

// NewValue registers the value state name on b.
func NewValue[T any](b *Backend, name string, c Codec[T], opts ...StateOption) (*Value[T], error) {
	return newValue(b, name, "value", c, opts)
}

func newValue[T any](b *Backend, name, kind string, c Codec[T], opts []StateOption) (*Value[T], error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil codec", ErrInvalid)
	}
	h, err := newHandle(b, name, kind, c.ID(), opts)
	if err != nil {
		return nil, err
	}
	return &Value[T]{h: h, codec: c}, nil
}

// Get returns the current key's value; false when unset (or expired).
func (v *Value[T]) Get() (T, bool, error) {
	var zero T
	k, err := v.h.key()
	if err != nil {
		return zero, false, err
	}
	b, ok, err := v.h.read(k)
	if err != nil || !ok {
		return zero, false, err
	}
	x, err := v.codec.Decode(b)
	if err != nil {
		return zero, false, fmt.Errorf("state: %s: %w", v.h.name, err)
	}
	return x, true, nil
}

// Set sets the current key's value.
func (v *Value[T]) Set(x T) error {
	k, err := v.h.key()
	if err != nil {
		return err
	}
	buf, err := v.codec.Append(v.h.valPrefix(), x)
	if err != nil {
		return fmt.Errorf("state: %s: %w", v.h.name, err)
	}
	v.h.vbuf = buf
	v.h.b.cur.put(k, buf)
	return nil
}

// Clear removes the current key's value.
func (v *Value[T]) Clear() error {
	k, err := v.h.key()
	if err != nil {
		return err
	}
	v.h.b.cur.del(k)
	return nil
}

// Keys calls fn with each key that has this state in keyGroup, in key
// order, until fn returns false. The keys are collected first, so fn may
// use SetCurrentKey and the handles; key is fn's to keep.
func (v *Value[T]) Keys(keyGroup uint16, fn func(key []byte) bool) error {
	return v.h.keys(keyGroup, fn)
}

// List is a list of values per key, stored as one entry (length-prefixed
// elements): an Add touches only the write-back layer after the first per
// checkpoint. A TTL applies to the whole list.
type List[T any] struct {
	h     handle
	codec Codec[T]
	ebuf  []byte
}

// NewList registers the list state name on b.
func NewList[T any](b *Backend, name string, c Codec[T], opts ...StateOption) (*List[T], error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil codec", ErrInvalid)
	}
	h, err := newHandle(b, name, "list", c.ID(), opts)
	if err != nil {
		return nil, err
	}
	return &List[T]{h: h, codec: c}, nil
}

// Add appends x to the current key's list.
func (l *List[T]) Add(x T) error {
	k, err := l.h.key()
	if err != nil {
		return err
	}
	enc, err := l.codec.Append(l.ebuf[:0], x)
	if err != nil {
		return fmt.Errorf("state: %s: %w", l.h.name, err)
	}
	l.ebuf = enc
	var elem [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(elem[:], uint64(len(enc)))
	if l.h.cfg == nil && l.h.b.inCurrent(k) {
		l.h.b.cur.appendTo(k, elem[:n])
		l.h.b.cur.appendTo(k, enc)
		return nil
	}
	old, _, err := l.h.read(k)
	if err != nil {
		return err
	}
	buf := append(l.h.valPrefix(), old...)
	buf = append(append(buf, elem[:n]...), enc...)
	l.h.vbuf = buf
	l.h.b.cur.put(k, buf)
	return nil
}

// Get returns the current key's list (nil when empty).
func (l *List[T]) Get() ([]T, error) {
	var out []T
	for x, err := range l.All() {
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

// All yields the current key's elements in order; on an error it yields the
// zero T and the error, then stops. The list must not be changed during the
// iteration.
func (l *List[T]) All() iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		k, err := l.h.key()
		if err != nil {
			yield(zero, err)
			return
		}
		b, ok, err := l.h.read(k)
		if err != nil || !ok {
			if err != nil {
				yield(zero, err)
			}
			return
		}
		for len(b) > 0 {
			n, w := binary.Uvarint(b)
			if w <= 0 || uint64(len(b)-w) < n {
				yield(zero, fmt.Errorf("%w: %s: malformed list", ErrDecode, l.h.name))
				return
			}
			x, err := l.codec.Decode(b[w : w+int(n)])
			if err != nil {
				yield(zero, fmt.Errorf("state: %s: %w", l.h.name, err))
				return
			}
			if !yield(x, nil) {
				return
			}
			b = b[w+int(n):]
		}
	}
}

// Update replaces the current key's list with xs (empty clears it).
func (l *List[T]) Update(xs []T) error {
	k, err := l.h.key()
	if err != nil {
		return err
	}
	if len(xs) == 0 {
		l.h.b.cur.del(k)
		return nil
	}
	buf := l.h.valPrefix()
	for _, x := range xs {
		enc, err := l.codec.Append(l.ebuf[:0], x)
		if err != nil {
			return fmt.Errorf("state: %s: %w", l.h.name, err)
		}
		l.ebuf = enc
		buf = append(binary.AppendUvarint(buf, uint64(len(enc))), enc...)
	}
	l.h.vbuf = buf
	l.h.b.cur.put(k, buf)
	return nil
}

// Clear removes the current key's list.
func (l *List[T]) Clear() error { return l.Update(nil) }

// Keys is Value.Keys for lists.
func (l *List[T]) Keys(keyGroup uint16, fn func(key []byte) bool) error {
	return l.h.keys(keyGroup, fn)
}

// Map is a map per key; entries are stored one per store key, ordered by
// the key codec's encoding. A TTL applies per entry.
type Map[K, V any] struct {
	h  handle
	kc Codec[K]
	vc Codec[V]
	mk []byte
}

// NewMap registers the map state name on b.
func NewMap[K, V any](b *Backend, name string, kc Codec[K], vc Codec[V], opts ...StateOption) (*Map[K, V], error) {
	if kc == nil || vc == nil {
		return nil, fmt.Errorf("%w: nil codec", ErrInvalid)
	}
	h, err := newHandle(b, name, "map", kc.ID()+"->"+vc.ID(), opts)
	if err != nil {
		return nil, err
	}
	return &Map[K, V]{h: h, kc: kc, vc: vc}, nil
}

// entryKey returns the layer key of the current key's entry k.
func (m *Map[K, V]) entryKey(k K) ([]byte, error) {
	base, err := m.h.key()
	if err != nil {
		return nil, err
	}
	buf, err := m.kc.Append(append(m.mk[:0], base...), k)
	if err != nil {
		return nil, fmt.Errorf("state: %s: key: %w", m.h.name, err)
	}
	m.mk = buf
	return buf, nil
}

// Get returns the current key's entry for k.
func (m *Map[K, V]) Get(k K) (V, bool, error) {
	var zero V
	key, err := m.entryKey(k)
	if err != nil {
		return zero, false, err
	}
	b, ok, err := m.h.read(key)
	if err != nil || !ok {
		return zero, false, err
	}
	v, err := m.decode(b)
	return v, err == nil, err
}

// decode decodes an entry's value.
func (m *Map[K, V]) decode(b []byte) (V, error) {
	v, err := m.vc.Decode(b)
	if err != nil {
		var zero V
		return zero, fmt.Errorf("state: %s: %w", m.h.name, err)
	}
	return v, nil
}

// Put sets the current key's entry k to v.
func (m *Map[K, V]) Put(k K, v V) error {
	key, err := m.entryKey(k)
	if err != nil {
		return err
	}
	buf, err := m.vc.Append(m.h.valPrefix(), v)
	if err != nil {
		return fmt.Errorf("state: %s: %w", m.h.name, err)
	}
	m.h.vbuf = buf
	m.h.b.cur.put(key, buf)
	return nil
}

// Delete removes the current key's entry k.
func (m *Map[K, V]) Delete(k K) error {
	key, err := m.entryKey(k)
	if err != nil {
		return err
	}
	m.h.b.cur.del(key)
	return nil
}

// Contains reports whether the current key has an entry k.
func (m *Map[K, V]) Contains(k K) (bool, error) {
	key, err := m.entryKey(k)
	if err != nil {
		return false, err
	}
	_, ok, err := m.h.read(key)
	return ok, err
}

// Range calls fn for each entry of the current key in encoded-key order
// until fn returns false. fn must not modify state during Range (collect
// first); Range returns the first decoding or store error.
func (m *Map[K, V]) Range(fn func(k K, v V) bool) error {
	base, err := m.h.key()
	if err != nil {
		return err
	}
	kg := m.h.b.kg
	plen := len(base) - 2
	var now int64
	if m.h.cfg != nil {
		now = m.h.cfg.clock().UnixNano()
	}
	return m.h.b.scan(kg, base[2:], func(sk, val []byte) (bool, error) {
		if m.h.cfg != nil {
			if len(val) < 8 {
				return false, fmt.Errorf("%w: %s: TTL value of %d bytes", ErrDecode, m.h.name, len(val))
			}
			if int64(binary.BigEndian.Uint64(val)) <= now {
				return true, nil
			}
			val = val[8:]
		}
		k, err := m.kc.Decode(sk[plen:])
		if err != nil {
			return false, fmt.Errorf("state: %s: key: %w", m.h.name, err)
		}
		v, err := m.vc.Decode(val)
		if err != nil {
			return false, fmt.Errorf("state: %s: %w", m.h.name, err)
		}
		return fn(k, v), nil
	})
}

// Clear removes every entry of the current key (one range deletion).
func (m *Map[K, V]) Clear() error {
	base, err := m.h.key()
	if err != nil {
		return err
	}
	from := append([]byte(nil), base...)
	m.h.b.cur.deleteRange(from, prefixEnd(from))
	return nil
}

// IsEmpty reports whether the current key has no entries.
func (m *Map[K, V]) IsEmpty() (bool, error) {
	empty := true
	err := m.Range(func(K, V) bool { empty = false; return false })
	return empty, err
}

// Keys is Value.Keys for maps: keys with at least one entry.
func (m *Map[K, V]) Keys(keyGroup uint16, fn func(key []byte) bool) error {
	return m.h.keys(keyGroup, fn)
}

// Reducing keeps one value per key, combining each added value with reduce.
type Reducing[T any] struct {
	v      *Value[T]
	reduce func(a, b T) T
}

// NewReducing registers the reducing state name on b.
func NewReducing[T any](b *Backend, name string, c Codec[T], reduce func(a, b T) T, opts ...StateOption) (*Reducing[T], error) {
	if reduce == nil {
		return nil, fmt.Errorf("%w: nil reduce function", ErrInvalid)
	}
	v, err := newValue(b, name, "reducing", c, opts)
	if err != nil {
		return nil, err
	}
	return &Reducing[T]{v: v, reduce: reduce}, nil
}

// Add folds x into the current key's value.
func (r *Reducing[T]) Add(x T) error {
	old, ok, err := r.v.Get()
	if err != nil {
		return err
	}
	if ok {
		x = r.reduce(old, x)
	}
	return r.v.Set(x)
}

// Get returns the current key's value.
func (r *Reducing[T]) Get() (T, bool, error) { return r.v.Get() }

// Clear removes the current key's value.
func (r *Reducing[T]) Clear() error { return r.v.Clear() }

// Keys is Value.Keys for reducing state.
func (r *Reducing[T]) Keys(keyGroup uint16, fn func(key []byte) bool) error {
	return r.v.Keys(keyGroup, fn)
}

// Aggregator folds inputs into an accumulator and derives a result.
type Aggregator[IN, ACC, OUT any] interface {
	// CreateAccumulator returns the empty accumulator.
	CreateAccumulator() ACC
	// Add folds in into acc and returns the new accumulator.
	Add(acc ACC, in IN) ACC
	// Result derives the output from acc.
	Result(acc ACC) OUT
}

// Aggregating keeps one accumulator per key.
type Aggregating[IN, ACC, OUT any] struct {
	v   *Value[ACC]
	agg Aggregator[IN, ACC, OUT]
}

// NewAggregating registers the aggregating state name on b.
func NewAggregating[IN, ACC, OUT any](b *Backend, name string, accCodec Codec[ACC], agg Aggregator[IN, ACC, OUT], opts ...StateOption) (*Aggregating[IN, ACC, OUT], error) {
	if agg == nil {
		return nil, fmt.Errorf("%w: nil aggregator", ErrInvalid)
	}
	v, err := newValue(b, name, "aggregating", accCodec, opts)
	if err != nil {
		return nil, err
	}
	return &Aggregating[IN, ACC, OUT]{v: v, agg: agg}, nil
}

// Add folds in into the current key's accumulator.
func (a *Aggregating[IN, ACC, OUT]) Add(in IN) error {
	acc, ok, err := a.v.Get()
	if err != nil {
		return err
	}
	if !ok {
		acc = a.agg.CreateAccumulator()
	}
	return a.v.Set(a.agg.Add(acc, in))
}

// Get returns the result for the current key; false when nothing was added.
func (a *Aggregating[IN, ACC, OUT]) Get() (OUT, bool, error) {
	var zero OUT
	acc, ok, err := a.v.Get()
	if err != nil || !ok {
		return zero, false, err
	}
	return a.agg.Result(acc), true, nil
}

// Clear removes the current key's accumulator.
func (a *Aggregating[IN, ACC, OUT]) Clear() error { return a.v.Clear() }

// Keys is Value.Keys for aggregating state.
func (a *Aggregating[IN, ACC, OUT]) Keys(keyGroup uint16, fn func(key []byte) bool) error {
	return a.v.Keys(keyGroup, fn)
}
