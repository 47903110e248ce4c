package sourcetest_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/source/sourcetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logSource is an in-memory source over append-only logs, one per split:
// correct unless bug names a deliberate breach of the contract. Offsets
// are the index of the next record, 8 bytes big-endian.
type logSource struct {
	bug     string
	bounded bool // splits end at their length when opened
	initial int  // splits at construction

	mu struct {
		sync.Mutex
		logs    [][]string
		wake    chan struct{} // closed (and replaced) on every append
		splitsN int           // Splits calls
	}
}

func newLogSource(bug string, bounded bool, splits int) *logSource {
	l := &logSource{bug: bug, bounded: bounded, initial: splits}
	l.mu.logs = make([][]string, splits)
	l.mu.wake = make(chan struct{})
	return l
}

// add appends n records spread over the splits and returns their keys.
func (l *logSource) add(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, n)
	for i := range keys {
		sp := i % len(l.mu.logs)
		keys[i] = fmt.Sprintf("s%d-r%d", sp, len(l.mu.logs[sp]))
		l.mu.logs[sp] = append(l.mu.logs[sp], keys[i])
	}
	close(l.mu.wake)
	l.mu.wake = make(chan struct{})
	return keys
}

// addSplit adds a split holding n records.
func (l *logSource) addSplit(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	sp := len(l.mu.logs)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("s%d-r%d", sp, i)
	}
	l.mu.logs = append(l.mu.logs, keys)
	return keys
}

func (l *logSource) Splits(context.Context) ([]source.Split, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.splitsN++
	n := len(l.mu.logs)
	out := make([]source.Split, n)
	for i := range out {
		out[i] = source.Split{ID: "s" + strconv.Itoa(i)}
		if l.bug == "unstable-splits" && l.mu.splitsN > 1 {
			out[i].ID += "-again"
		}
	}
	return out, nil
}

func (l *logSource) DiscoverSplits(ctx context.Context) ([]source.Split, error) {
	splits, err := l.Splits(ctx)
	if l.bug == "discover-misses" && len(splits) > l.initial {
		splits = splits[:l.initial]
	}
	return splits, err
}

func (l *logSource) Open(_ context.Context, split source.Split, off []byte) (source.SplitReader[string], error) {
	i, err := strconv.Atoi(strings.TrimPrefix(split.ID, "s"))
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || i < 0 || i >= len(l.mu.logs) {
		return nil, fmt.Errorf("logsource: no split %q", split.ID)
	}
	r := &logReader{l: l, split: i, end: -1}
	if l.bounded {
		r.end = len(l.mu.logs[i])
	}
	if off != nil {
		switch {
		case len(off) == 8:
			r.next = int(binary.BigEndian.Uint64(off))
		case l.bug == "accepts-bad-offset":
		default:
			return nil, fmt.Errorf("%w: %d bytes", source.ErrBadOffset, len(off))
		}
		switch l.bug {
		case "repeat-after-restore":
			r.next = max(r.next-1, 0)
		case "skip-after-restore":
			r.next++
		case "redeliver":
			r.next = 0 // cannot seek: a restore starts over
		}
	}
	return r, nil
}

type logReader struct {
	l     *logSource
	split int
	next  int
	end   int // -1: unbounded
	ended bool
	off   []byte // shared-offset: the buffer Offset returns every time
	recs  []source.Record[string]
}

func encode(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) }

func (r *logReader) Poll(ctx context.Context, max int) ([]source.Record[string], error) {
	for {
		r.l.mu.Lock()
		log, wake := r.l.mu.logs[r.split], r.l.mu.wake
		r.l.mu.Unlock()
		if r.end >= 0 && r.next >= r.end {
			if r.l.bug == "never-ends" {
				r.end = -1 // waits for records that never come
				continue
			}
			if r.l.bug == "end-not-sticky" && r.ended {
				return nil, nil
			}
			r.ended = true
			return nil, source.ErrEndOfSplit
		}
		if r.l.bug == "lose-on-cancel" && ctx.Err() != nil && r.next < len(log) {
			r.next++ // dropped, never returned
			return nil, ctx.Err()
		}
		if n := len(log) - r.next; n > 0 {
			if r.end >= 0 {
				n = min(n, r.end-r.next)
			}
			if r.l.bug != "exceeds-max" || n <= max {
				n = min(n, max)
			}
			r.recs = r.recs[:0]
			for range n {
				r.next++
				r.recs = append(r.recs, source.Record[string]{Value: log[r.next-1], Offset: encode(r.next)})
			}
			if r.l.bug == "end-with-records" && r.end >= 0 && r.next >= r.end {
				r.ended = true
				return r.recs, source.ErrEndOfSplit
			}
			return r.recs, nil
		}
		if r.l.bug == "ignores-ctx" {
			select {
			case <-wake:
			case <-time.After(time.Second):
				return nil, nil
			}
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (r *logReader) Offset() []byte {
	if r.l.bug == "shared-offset" {
		if r.off == nil {
			r.off = make([]byte, 8)
		}
		binary.BigEndian.PutUint64(r.off, uint64(r.next))
		return r.off
	}
	return encode(r.next)
}

func (r *logReader) NotifyCheckpointComplete(context.Context, uint64) error { return nil }

func (r *logReader) Close() error {
	if r.l.bug == "close-fails" {
		return errors.New("logsource: close failed")
	}
	return nil
}

// logFactory makes instances of logSource with bug.
func logFactory(bug string, bounded bool) sourcetest.Factory[string] {
	return func(t *testing.T, n int) sourcetest.Instance[string] {
		l := newLogSource(bug, bounded, 3)
		return sourcetest.Instance[string]{
			Source:  l,
			Key:     func(s string) string { return s },
			Records: l.add(n),
			Produce: func(_ context.Context, n int) ([]string, error) { return l.add(n), nil },
			AddSplits: func(context.Context) ([]string, error) {
				return l.addSplit(5), nil
			},
		}
	}
}

// TestSuitePassesCorrectSources runs the suite on correct in-memory
// sources, bounded and unbounded, and on one that redelivers everything
// after a restore declared AtLeastOnce.
func TestSuitePassesCorrectSources(t *testing.T) {
	t.Run("Unbounded", func(t *testing.T) {
		sourcetest.Run(t, sourcetest.Features{}, logFactory("", false))
	})
	t.Run("Bounded", func(t *testing.T) {
		sourcetest.Run(t, sourcetest.Features{Bounded: true}, logFactory("", true))
	})
	t.Run("AtLeastOnce", func(t *testing.T) {
		sourcetest.Run(t, sourcetest.Features{AtLeastOnce: true}, logFactory("redeliver", false))
	})
}

// brokenCases are the deliberately broken sources, each with the check
// that must catch it and a part of the failure message. bounded is the
// source's behaviour; features what the test declares.
var brokenCases = []struct {
	bug      string
	bounded  bool
	features sourcetest.Features
	check    string
	message  string
}{
	{bug: "repeat-after-restore", check: "Restore", message: "a reader opened at offset"},
	{bug: "skip-after-restore", check: "Restore", message: "a reader opened at offset"},
	{bug: "repeat-after-restore", bounded: true, features: sourcetest.Features{Bounded: true}, check: "Restore", message: "a reader opened at offset"},
	{bug: "redeliver", check: "Restore", message: "a reader opened at offset"}, // not declared AtLeastOnce
	{bug: "lose-on-cancel", features: sourcetest.Features{Timeout: 2 * time.Second}, check: "CancelledPolls", message: "had not returned every record"},
	{bug: "end-not-sticky", bounded: true, features: sourcetest.Features{Bounded: true}, check: "ReadAll", message: "the end is not sticky"},
	{bug: "never-ends", bounded: true, features: sourcetest.Features{Bounded: true, Timeout: time.Second}, check: "ReadAll", message: "never returned ErrEndOfSplit"},
	{bug: "end-with-records", bounded: true, features: sourcetest.Features{Bounded: true}, check: "ReadAll", message: "ErrEndOfSplit with"},
	{bug: "exceeds-max", check: "Restore", message: "Poll(max 1) returned"},
	{bug: "shared-offset", check: "Restore", message: "Offset's slice belongs to the caller"},
	{bug: "unstable-splits", check: "Splits", message: "Splits is not stable"},
	{bug: "accepts-bad-offset", check: "BadOffset", message: "succeeded"},
	{bug: "ignores-ctx", features: sourcetest.Features{Prompt: 200 * time.Millisecond}, check: "PollHonoursContext", message: "after its ctx ended"},
	{bug: "discover-misses", features: sourcetest.Features{Timeout: time.Second}, check: "Discovery", message: "listed no new split"},
	{bug: "close-fails", check: "ReadAll", message: "Close: logsource: close failed"},
	// A bounded source declared unbounded.
	{bounded: true, check: "ReadAll", message: "declare Features.Bounded"},
}

const brokenEnv = "SOURCETEST_BROKEN"

// TestSuiteCatchesBrokenSources runs the suite on every broken source in a
// child process (a failing suite fails its test, which this test cannot
// contain) and checks that the child fails, in the check that names the
// breach, with its message.
func TestSuiteCatchesBrokenSources(t *testing.T) {
	for i, c := range brokenCases {
		name := fmt.Sprintf("%d-%s-bounded=%v", i, c.bug, c.bounded)
		t.Run(name, func(t *testing.T) {
			t.Parallel() // mostly waiting: quiet periods and timeouts
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenSource$", "-test.v", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+strconv.Itoa(i))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed a source with bug %q (err %v):\n%s", c.bug, err, out)
			}
			if want := "--- FAIL: TestBrokenSource/" + c.check + " "; !strings.Contains(string(out), want) {
				t.Fatalf("bug %q: no %q in the output:\n%s", c.bug, want, out)
			}
			if !strings.Contains(string(out), c.message) {
				t.Fatalf("bug %q: no %q in the output:\n%s", c.bug, c.message, out)
			}
		})
	}
}

// TestBrokenSource is the child of TestSuiteCatchesBrokenSources.
func TestBrokenSource(t *testing.T) {
	v := os.Getenv(brokenEnv)
	if v == "" {
		t.Skip("run by TestSuiteCatchesBrokenSources")
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 || i >= len(brokenCases) {
		t.Fatalf("%s=%q", brokenEnv, v)
	}
	c := brokenCases[i]
	sourcetest.Run(t, c.features, logFactory(c.bug, c.bounded))
}
