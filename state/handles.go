package state

import "iter"

// Value is a single value per key. Not safe for concurrent use (see Backend).
type Value[T any] struct {
	b     *Backend
	codec Codec[T]
}

// NewValue registers the value state name on b.
func NewValue[T any](b *Backend, name string, c Codec[T], opts ...StateOption) (*Value[T], error) {
	return nil, errNotImplemented
}

// Get returns the current key's value; false when unset (or expired).
func (v *Value[T]) Get() (T, bool, error) { var z T; return z, false, errNotImplemented }

// Set sets the current key's value.
func (v *Value[T]) Set(x T) error { return errNotImplemented }

// Clear removes the current key's value.
func (v *Value[T]) Clear() error { return errNotImplemented }

// Keys calls fn with each key that has this state in keyGroup (keys are
// collected first, so fn may use the handles; key is valid during the call).
func (v *Value[T]) Keys(keyGroup uint16, fn func(key []byte) bool) error { return errNotImplemented }

// List is a list of values per key, stored as one entry per key (an append
// touches only the write-back layer after the first per checkpoint).
type List[T any] struct {
	b     *Backend
	codec Codec[T]
}

// NewList registers the list state name on b.
func NewList[T any](b *Backend, name string, c Codec[T], opts ...StateOption) (*List[T], error) {
	return nil, errNotImplemented
}

// Add appends x to the current key's list.
func (l *List[T]) Add(x T) error { return errNotImplemented }

// Get returns the current key's list (nil when empty).
func (l *List[T]) Get() ([]T, error) { return nil, errNotImplemented }

// All yields the current key's elements in order; on an error it yields the
// zero T and the error, then stops.
func (l *List[T]) All() iter.Seq2[T, error] { return func(func(T, error) bool) {} }

// Update replaces the current key's list with xs (empty clears it).
func (l *List[T]) Update(xs []T) error { return errNotImplemented }

// Clear removes the current key's list.
func (l *List[T]) Clear() error { return errNotImplemented }

// Keys is Value.Keys for lists.
func (l *List[T]) Keys(keyGroup uint16, fn func(key []byte) bool) error { return errNotImplemented }

// Map is a map per key; entries are stored one per Pebble key, ordered by
// the key codec's encoding.
type Map[K, V any] struct {
	b *Backend
}

// NewMap registers the map state name on b.
func NewMap[K, V any](b *Backend, name string, kc Codec[K], vc Codec[V], opts ...StateOption) (*Map[K, V], error) {
	return nil, errNotImplemented
}

// Get returns the current key's entry for k.
func (m *Map[K, V]) Get(k K) (V, bool, error) { var z V; return z, false, errNotImplemented }

// Put sets the current key's entry k to v.
func (m *Map[K, V]) Put(k K, v V) error { return errNotImplemented }

// Delete removes the current key's entry k.
func (m *Map[K, V]) Delete(k K) error { return errNotImplemented }

// Contains reports whether the current key has an entry k.
func (m *Map[K, V]) Contains(k K) (bool, error) { return false, errNotImplemented }

// Range calls fn for each entry of the current key in encoded-key order
// until fn returns false. fn may modify the map; whether the iteration sees
// the changes is unspecified.
func (m *Map[K, V]) Range(fn func(k K, v V) bool) error { return errNotImplemented }

// Clear removes every entry of the current key (one range deletion).
func (m *Map[K, V]) Clear() error { return errNotImplemented }

// Keys is Value.Keys for maps: keys with at least one entry.
func (m *Map[K, V]) Keys(keyGroup uint16, fn func(key []byte) bool) error { return errNotImplemented }

// Reducing keeps one value per key, combining each added value with reduce.
type Reducing[T any] struct {
	v      *Value[T]
	reduce func(a, b T) T
}

// NewReducing registers the reducing state name on b.
func NewReducing[T any](b *Backend, name string, c Codec[T], reduce func(a, b T) T, opts ...StateOption) (*Reducing[T], error) {
	return nil, errNotImplemented
}

// Add folds x into the current key's value.
func (r *Reducing[T]) Add(x T) error { return errNotImplemented }

// Get returns the current key's value.
func (r *Reducing[T]) Get() (T, bool, error) { var z T; return z, false, errNotImplemented }

// Clear removes the current key's value.
func (r *Reducing[T]) Clear() error { return errNotImplemented }

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
	return nil, errNotImplemented
}

// Add folds in into the current key's accumulator.
func (a *Aggregating[IN, ACC, OUT]) Add(in IN) error { return errNotImplemented }

// Get returns the result for the current key; false when nothing was added.
func (a *Aggregating[IN, ACC, OUT]) Get() (OUT, bool, error) {
	var z OUT
	return z, false, errNotImplemented
}

// Clear removes the current key's accumulator.
func (a *Aggregating[IN, ACC, OUT]) Clear() error { return errNotImplemented }
