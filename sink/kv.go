package sink

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// ErrClosed is returned by KV methods after Close.
var ErrClosed = errors.New("sink: closed")

// KV is an idempotent key-value sink on its own Pebble database. Each record
// is stored under a deterministic id derived from the record (key), so a
// record replayed after a crash overwrites its earlier copy instead of
// duplicating it: with a deterministic job, KV output is exactly-once in
// effect. Writes are batched and committed with fsync at each Flush
// (barrier).
//
// Write and Flush are for the sink's task goroutine; Get and All may be
// called from any goroutine (they read committed data). Close is idempotent.
type KV[T any] struct {
	key   func(T) []byte
	value func(dst []byte, v T) ([]byte, error)
	buf   []byte

	mu struct {
		sync.Mutex
		db    *pebble.DB
		batch *pebble.Batch
	}
}

// NewKV opens (creating if needed) a KV sink in dir. key returns the record's
// deterministic id; value appends its encoding to dst.
func NewKV[T any](dir string, key func(T) []byte, value func(dst []byte, v T) ([]byte, error)) (*KV[T], error) {
	if key == nil || value == nil {
		return nil, errors.New("sink: KV needs key and value functions")
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		return nil, fmt.Errorf("sink: open KV %s: %w", dir, err)
	}
	k := &KV[T]{key: key, value: value}
	k.mu.db = db
	return k, nil
}

// Write implements Sink: it stages the record in the current batch.
func (k *KV[T]) Write(_ context.Context, v T) error {
	var err error
	k.buf, err = k.value(k.buf[:0], v)
	if err != nil {
		return fmt.Errorf("sink: KV encode: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mu.db == nil {
		return ErrClosed
	}
	if k.mu.batch == nil {
		k.mu.batch = k.mu.db.NewBatch()
	}
	return k.mu.batch.Set(k.key(v), k.buf, nil)
}

// Flush implements Sink: it commits the staged batch with fsync.
func (k *KV[T]) Flush(context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mu.db == nil {
		return ErrClosed
	}
	return k.flushLocked()
}

func (k *KV[T]) flushLocked() error {
	b := k.mu.batch
	if b == nil {
		return nil
	}
	k.mu.batch = nil
	err := b.Commit(pebble.Sync)
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sink: KV commit: %w", err)
	}
	return nil
}

// Get returns a copy of the committed value stored under id.
func (k *KV[T]) Get(id []byte) ([]byte, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mu.db == nil {
		return nil, false, ErrClosed
	}
	v, closer, err := k.mu.db.Get(id)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := append([]byte(nil), v...)
	return out, true, closer.Close()
}

// All iterates over the committed (id, value) pairs in id order. The slices
// are valid only during the iteration step. Iteration stops at the first
// error (ErrClosed after Close, or the store's), which is yielded last,
// with a nil key and the error's text as the value.
func (k *KV[T]) All() iter.Seq2[[]byte, []byte] {
	return func(yield func([]byte, []byte) bool) {
		fail := func(err error) { yield(nil, []byte(err.Error())) }
		k.mu.Lock()
		db := k.mu.db
		k.mu.Unlock()
		if db == nil {
			fail(ErrClosed)
			return
		}
		it, err := db.NewIter(nil)
		if err != nil {
			fail(fmt.Errorf("sink: KV iterate: %w", err))
			return
		}
		for ok := it.First(); ok; ok = it.Next() {
			if !yield(it.Key(), it.Value()) {
				_ = it.Close() // the caller stopped; its error would go nowhere
				return
			}
		}
		err = it.Error()
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fail(fmt.Errorf("sink: KV iterate: %w", err))
		}
	}
}

// Close flushes nothing (uncommitted writes are dropped, as they would be by a
// crash) and closes the database. It is idempotent.
func (k *KV[T]) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mu.db == nil {
		return nil
	}
	if k.mu.batch != nil {
		_ = k.mu.batch.Close() // dropping staged writes; Close error is irrelevant
		k.mu.batch = nil
	}
	err := k.mu.db.Close()
	k.mu.db = nil
	return err
}

// quietLogger drops Pebble's informational logs (fatal errors still stop
// the process, as Pebble requires).
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Errorf("sink: KV pebble fatal: "+format, args...))
}
