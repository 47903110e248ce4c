package window_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// base is a minute-aligned origin for the tests' event times.
var base = time.Unix(1_700_000_040, 0)

func sec(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }

// ev is a test record: a key, an event time (seconds after base) and a
// value.
type ev struct {
	K string  `json:"k"`
	T float64 `json:"t"`
	V int64   `json:"v"`
}

func (e ev) String() string { return fmt.Sprintf("%s@%gs", e.K, e.T) }

func at(e ev) time.Time { return sec(e.T) }

func key(e ev) string { return e.K }

// scripted is a source whose splits return ONE record per Poll, so that
// the watermark advances after every record: out-of-order input then gives
// exactly determined late records. A split listed in hold blocks after its
// records until the channel is closed (an idle split), then ends.
type scripted struct {
	splits [][]ev
	hold   map[int]chan struct{}
}

func (s *scripted) Splits(context.Context) ([]source.Split, error) {
	out := make([]source.Split, len(s.splits))
	for i := range out {
		out[i] = source.Split{ID: strconv.Itoa(i)}
	}
	return out, nil
}

func (s *scripted) Open(_ context.Context, sp source.Split, restored []byte) (source.SplitReader[ev], error) {
	i, err := strconv.Atoi(sp.ID)
	if err != nil || i < 0 || i >= len(s.splits) {
		return nil, fmt.Errorf("no split %q", sp.ID)
	}
	r := &scriptReader{recs: s.splits[i], hold: s.hold[i]}
	if len(restored) == 8 {
		r.next = int(binary.BigEndian.Uint64(restored))
	}
	return r, nil
}

type scriptReader struct {
	recs []ev
	next int
	hold chan struct{}
	out  [1]source.Record[ev]
}

func (r *scriptReader) Poll(ctx context.Context, _ int) ([]source.Record[ev], error) {
	if r.next < len(r.recs) {
		e := r.recs[r.next]
		r.next++
		r.out[0] = source.Record[ev]{Value: e, EventTime: at(e), Offset: r.Offset()}
		return r.out[:], nil
	}
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-ctx.Done():
			return nil, nil
		}
	}
	return nil, source.ErrEndOfSplit
}

func (r *scriptReader) Offset() []byte { return binary.BigEndian.AppendUint64(nil, uint64(r.next)) }

func (r *scriptReader) NotifyCheckpointComplete(context.Context, uint64) error { return nil }

func (r *scriptReader) Close() error { return nil }

// collect is a goroutine-safe sink that keeps what it receives.
type collect[T any] struct {
	mu struct {
		sync.Mutex
		got []T
	}
}

func (c *collect[T]) sink() *sink.Func[T] {
	return sink.NewFunc(func(_ context.Context, v T) error {
		c.mu.Lock()
		c.mu.got = append(c.mu.got, v)
		c.mu.Unlock()
		return nil
	}, nil)
}

func (c *collect[T]) all() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.mu.got)
}

func runJob(t *testing.T, job *pipeline.Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := job.Run(ctx); err != nil {
		t.Fatalf("job: %v", err)
	}
}

// fmtResult renders a result relative to base: "a [0s,10s) 3 #1".
func fmtResult[V any](r window.Result[string, V]) string {
	return fmt.Sprintf("%s [%v,%v) %v #%d", r.Key, r.Start.Sub(base), r.End.Sub(base), r.Value, r.Firing)
}

func fmtResults[V any](rs []window.Result[string, V]) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmtResult(r)
	}
	return out
}

// sorted returns a sorted copy.
func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}
