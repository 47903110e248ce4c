package pipeline_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// countingKeys is a string key codec that counts its encodings.
type countingKeys struct{ appends *atomic.Int64 }

func (c countingKeys) Append(dst []byte, k string) ([]byte, error) {
	c.appends.Add(1)
	return append(dst, k...), nil
}
func (c countingKeys) Decode(b []byte) (string, error) { return string(b), nil }
func (c countingKeys) ID() string                      { return "counting-string" }

// TestKeyedKeyEncodedOnce: a keyed operator's key is encoded once per
// record, by the sender (which needs the bytes for the key group); the
// subtask sets its state's current key from those bytes instead of
// encoding the key again. The per-key counts show the state is still
// keyed by them.
func TestKeyedKeyEncodedOnce(t *testing.T) {
	const records, keys = 1000, 10
	vals := make([]string, records)
	for i := range vals {
		vals[i] = fmt.Sprintf("k%d", i%keys)
	}
	var appends atomic.Int64
	var out collect[string]
	job := pipeline.New("key-once", pipeline.CheckpointDir(t.TempDir()), pipeline.DefaultParallelism(2))
	src := pipeline.FromSource(job, "src", source.NewSlice(vals, 2))
	counts := pipeline.Process(pipeline.KeyByCodec(src, func(s string) string { return s }, countingKeys{&appends}), "count",
		func() pipeline.KeyedProcessFunc[string, string, string] {
			var n *state.Value[int64]
			return &pipeline.ProcessFuncs[string, string, string]{
				OpenFn: func(oc *pipeline.OpenContext) (err error) {
					n, err = state.NewValue(oc.Backend(), "n", state.Int64Codec())
					return err
				},
				ProcessFn: func(ctx *pipeline.KeyedContext[string, string], v string) error {
					if ctx.Key() != v {
						return fmt.Errorf("key %q for record %q", ctx.Key(), v)
					}
					if string(ctx.CurrentKeyBytes()) != v {
						return fmt.Errorf("current key bytes %q for record %q", ctx.CurrentKeyBytes(), v)
					}
					c, _, err := n.Get()
					if err != nil {
						return err
					}
					if err := n.Set(c + 1); err != nil {
						return err
					}
					if c+1 == records/keys {
						return ctx.Emit(v)
					}
					return nil
				},
			}
		})
	pipeline.To(counts, "out", out.sink())
	runJob(t, job)
	if got := len(out.all()); got != keys {
		t.Fatalf("%d keys reached %d records, want %d: %v", got, records/keys, keys, out.all())
	}
	if got := appends.Load(); got != records {
		t.Fatalf("key codec encoded %d times for %d records, want once per record", got, records)
	}
}
