package sink_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/sink/sinktest"
)

// kvInstance is a KV sink that tells its harness when it is closed (only
// one instance can have the database open).
type kvInstance struct {
	*sink.KV[string]
	h *kvHarness
}

func (k kvInstance) Close() error {
	k.h.open = nil
	return k.KV.Close()
}

type kvHarness struct {
	dir  string
	open *sink.KV[string] // the instance that has the database open
}

func kvKey(s string) []byte { return []byte(s) }

func kvValue(dst []byte, s string) ([]byte, error) { return append(dst, s...), nil }

func (h *kvHarness) new(context.Context) (sink.Sink[string], error) {
	kv, err := sink.NewKV(h.dir, kvKey, kvValue)
	if err != nil {
		return nil, err
	}
	h.open = kv
	return kvInstance{KV: kv, h: h}, nil
}

// visible reads the committed entries, through the open instance or, when
// none is open, by opening the database.
func (h *kvHarness) visible(context.Context) ([]string, error) {
	kv := h.open
	if kv == nil {
		var err error
		if kv, err = sink.NewKV(h.dir, kvKey, kvValue); err != nil {
			return nil, err
		}
		defer kv.Close()
	}
	var keys []string
	for k, v := range kv.All() {
		if k == nil {
			return nil, errors.New(string(v))
		}
		if string(k) != string(v) {
			return nil, &kvMismatch{k: string(k), v: string(v)}
		}
		keys = append(keys, string(k))
	}
	return keys, nil
}

type kvMismatch struct{ k, v string }

func (e *kvMismatch) Error() string { return "kv: key " + e.k + " holds " + e.v }

// TestKVConformance runs the KV sink through the plain sink checks
// (sinktest): Flush commits with fsync, and replays overwrite (Idempotent).
func TestKVConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Features{Idempotent: true}, func(t *testing.T) sinktest.System[string] {
		h := &kvHarness{dir: t.TempDir()}
		return sinktest.System[string]{New: h.new, Record: func(k string) string { return k }, Visible: h.visible}
	})
}

// TestFuncConformance runs a Func sink whose functions stage records and
// publish them at each flush through the plain sink checks: Func calls
// write for every record and flush at every Flush.
func TestFuncConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
		var mu sync.Mutex
		var published []string
		return sinktest.System[string]{
			New: func(context.Context) (sink.Sink[string], error) {
				var staged []string // this instance's, lost with it
				return sink.NewFunc(func(_ context.Context, k string) error {
					staged = append(staged, k)
					return nil
				}, func(context.Context) error {
					mu.Lock()
					defer mu.Unlock()
					published = append(published, staged...)
					staged = nil
					return nil
				}), nil
			},
			Record: func(k string) string { return k },
			Visible: func(context.Context) ([]string, error) {
				mu.Lock()
				defer mu.Unlock()
				return append([]string(nil), published...), nil
			},
		}
	})
}

// lockedBuffer is a bytes.Buffer safe to read while a sink writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Fields(b.buf.String())
}

// TestStdoutConformance runs the Stdout sink through the plain sink
// checks: what was written before Flush is in the writer once it returns.
func TestStdoutConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
		out := &lockedBuffer{}
		return sinktest.System[string]{
			New:     func(context.Context) (sink.Sink[string], error) { return sink.NewStdout[string](out, nil), nil },
			Record:  func(k string) string { return k },
			Visible: func(context.Context) ([]string, error) { return out.lines(), nil },
		}
	})
}
