package sinktest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/sink"
)

// Features says how the sink under test differs from the plain case, and
// sizes the checks.
type Features struct {
	// Idempotent says a record written again (a replay after a crash)
	// overwrites its earlier copy (Run only; two-phase-commit sinks are
	// always checked for exactly once).
	Idempotent bool
	// Records is the number of records of each epoch (default 8).
	Records int
	// Timeout bounds each wait for Visible to show what it must, and each
	// sink call (default 30 s).
	Timeout time.Duration
	// Quiet is how long the suite waits at the end of each check before it
	// reads Visible a last time (default 100 ms). It can only miss a bug,
	// never report a false one.
	Quiet time.Duration
}

func (f Features) withDefaults() Features {
	if f.Records <= 0 {
		f.Records = 8
	}
	if f.Timeout <= 0 {
		f.Timeout = 30 * time.Second
	}
	if f.Quiet <= 0 {
		f.Quiet = 100 * time.Millisecond
	}
	return f
}

// System is the sink under test and the external system it writes to,
// made by the caller's factory for one check.
type System[T any] struct {
	// New makes a new instance of the sink, as a new run of the job would
	// make it: the same identity (producer group, transaction names, …)
	// over the same external system. RunTwoPhaseCommit needs instances
	// that implement sink.TwoPhaseCommit[T]. The suite closes every
	// instance it gets.
	New func(ctx context.Context) (sink.Sink[T], error)
	// Record returns the record for key; the suite makes up the keys
	// (short ASCII strings), each used for one record.
	Record func(key string) T
	// Visible returns the keys of the records visible now in the external
	// system to its consumers (committed only), one entry per copy, in any
	// order. It may be called at any time, from the test goroutine.
	Visible func(ctx context.Context) ([]string, error)
	// Open, when not nil, returns how many of the sink's transactions the
	// external system holds open: pre-committed or started, and neither
	// committed nor aborted (prepared transactions, half messages).
	Open func(ctx context.Context) (int, error)
}

// Factory makes a System over a fresh part of the external system. It is
// called once for every check, on that check's subtest; what it starts
// it stops with t.Cleanup.
type Factory[T any] func(t *testing.T) System[T]

// RunTwoPhaseCommit runs the two-phase-commit checks (see the package
// documentation) on the sinks newSystem makes, each in a subtest of t.
func RunTwoPhaseCommit[T any](t *testing.T, f Features, newSystem Factory[T]) {
	t.Helper()
	s := &suite[T]{f: f.withDefaults(), factory: newSystem, tpc: true}
	t.Run("CommitMakesVisible", s.wrap(s.testCommitMakesVisible))
	t.Run("CommitIdempotent", s.wrap(s.testCommitIdempotent))
	t.Run("SkippedNotification", s.wrap(s.testSkippedNotification))
	t.Run("LateCommit", s.wrap(s.testLateCommit))
	t.Run("Abort", s.wrap(s.testAbort))
	t.Run("CrashBeforeCommit", s.wrap(s.testCrashBeforeCommit))
	t.Run("CrashAfterCommit", s.wrap(s.testCrashAfterCommit))
	t.Run("CrashWithSkippedNotification", s.wrap(s.testCrashWithSkippedNotification))
	t.Run("RecoverAbortsOthers", s.wrap(s.testRecoverAbortsOthers))
	t.Run("AsyncCommit", s.wrap(s.testAsyncCommit))
}

// Run runs the checks of a plain sink.Sink (see the package
// documentation) on the sinks newSystem makes, each in a subtest of t.
func Run[T any](t *testing.T, f Features, newSystem Factory[T]) {
	t.Helper()
	s := &suite[T]{f: f.withDefaults(), factory: newSystem}
	t.Run("FlushMakesVisible", s.wrap(s.testFlushMakesVisible))
	t.Run("FlushedSurvivesCrash", s.wrap(s.testFlushedSurvivesCrash))
	t.Run("Replay", s.wrap(s.testReplay))
}

type suite[T any] struct {
	f       Features
	factory Factory[T]
	tpc     bool
}

func (s *suite[T]) wrap(fn func(c *check[T])) func(t *testing.T) {
	return func(t *testing.T) {
		sys := s.factory(t)
		switch {
		case sys.New == nil:
			t.Fatal("sinktest: the factory returned no New function")
		case sys.Record == nil:
			t.Fatal("sinktest: the factory returned no Record function")
		case sys.Visible == nil:
			t.Fatal("sinktest: the factory returned no Visible function")
		}
		ctx, cancel := context.WithCancel(context.Background())
		c := &check[T]{t: t, f: s.f, sys: sys, ctx: ctx, tpc: s.tpc, want: map[string]bounds{}}
		t.Cleanup(func() {
			for _, in := range c.instances {
				if !in.closed {
					in.closed = true
					_ = in.s.Close() // the check failed before closing it
				}
			}
			cancel()
		})
		fn(c)
	}
}

// bounds are how many copies of a key Visible may show.
type bounds struct{ min, max int }

// check is one check's state: the instances it made and what Visible
// must show.
type check[T any] struct {
	t         *testing.T
	f         Features
	sys       System[T]
	ctx       context.Context
	tpc       bool
	instances []*instance[T]
	want      map[string]bounds
	keys      int // keys made up so far
}

// instance is one sink instance (one simulated process).
type instance[T any] struct {
	n      int // 1, 2, … in the order made
	s      sink.Sink[T]
	tpc    sink.TwoPhaseCommit[T]
	async  sink.AsyncCommitter
	closed bool
}

func (in *instance[T]) String() string { return fmt.Sprintf("instance %d", in.n) }

// timeout returns a ctx of the check ending after Features.Timeout.
func (c *check[T]) timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx, c.f.Timeout)
}

// start makes a new instance; a two-phase-commit one then gets Recover
// with pending, as the runtime does before any Write.
func (c *check[T]) start(pending ...[]byte) *instance[T] {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	s, err := c.sys.New(ctx)
	if err != nil {
		c.t.Fatalf("New: %v", err)
	}
	if s == nil {
		c.t.Fatal("New returned a nil sink")
	}
	in := &instance[T]{n: len(c.instances) + 1, s: s}
	c.instances = append(c.instances, in)
	if !c.tpc {
		return in
	}
	tpc, ok := s.(sink.TwoPhaseCommit[T])
	if !ok {
		c.t.Fatalf("New returned a %T, which does not implement sink.TwoPhaseCommit", s)
	}
	in.tpc = tpc
	in.async, _ = s.(sink.AsyncCommitter)
	if err := tpc.Recover(ctx, pending); err != nil {
		c.t.Fatalf("%v: Recover(%d transactions): %v", in, len(pending), err)
	}
	return in
}

// write writes n new records and returns their keys (not yet expected
// visible).
func (c *check[T]) write(in *instance[T], n int) []string {
	c.t.Helper()
	keys := make([]string, n)
	for i := range keys {
		c.keys++
		keys[i] = fmt.Sprintf("r%04d", c.keys)
	}
	c.writeKeys(in, keys)
	return keys
}

// writeKeys writes the records of keys (again, for a replay).
func (c *check[T]) writeKeys(in *instance[T], keys []string) {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	for _, k := range keys {
		if err := in.s.Write(ctx, c.sys.Record(k)); err != nil {
			c.t.Fatalf("%v: Write(%s): %v", in, k, err)
		}
	}
}

func (c *check[T]) preCommit(in *instance[T], id uint64) []byte {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	txn, err := in.tpc.PreCommit(ctx, id)
	if err != nil {
		c.t.Fatalf("%v: PreCommit(%d): %v", in, id, err)
	}
	return txn
}

func (c *check[T]) commit(in *instance[T], txn []byte, what string) {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	if err := in.tpc.Commit(ctx, txn); err != nil {
		c.t.Fatalf("%v: Commit (%s): %v", in, what, err)
	}
}

func (c *check[T]) abort(in *instance[T], txn []byte, what string) {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	if err := in.tpc.Abort(ctx, txn); err != nil {
		c.t.Fatalf("%v: Abort (%s): %v", in, what, err)
	}
}

func (c *check[T]) flush(in *instance[T]) {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	if err := in.s.Flush(ctx); err != nil {
		c.t.Fatalf("%v: Flush: %v", in, err)
	}
}

// close closes in (once): the end of a run, or a crash after which the
// suite never uses in again.
func (c *check[T]) close(in *instance[T]) {
	c.t.Helper()
	if in.closed {
		return
	}
	in.closed = true
	if err := in.s.Close(); err != nil {
		c.t.Fatalf("%v: Close: %v", in, err)
	}
}

// expect adds keys to what Visible must show, each between min and max
// times.
func (c *check[T]) expect(min, max int, keys ...string) {
	for _, k := range keys {
		c.want[k] = bounds{min, max}
	}
}

// diff compares Visible's keys with c.want; "" when they match. excess
// reports copies that must not be visible: waiting cannot mend those
// (what is committed stays visible).
func (c *check[T]) diff(visible []string) (d string, excess bool) {
	got := map[string]int{}
	for _, k := range visible {
		got[k]++
	}
	var missing, repeated, unexpected []string
	for k, b := range c.want {
		switch n := got[k]; {
		case n < b.min:
			missing = append(missing, k)
		case n > b.max && b.max > 0:
			repeated = append(repeated, fmt.Sprintf("%s ×%d", k, n))
		case n > b.max:
			unexpected = append(unexpected, fmt.Sprintf("%s ×%d", k, n))
		}
	}
	for k, n := range got {
		if _, ok := c.want[k]; !ok {
			unexpected = append(unexpected, fmt.Sprintf("%s ×%d", k, n))
		}
	}
	if len(missing)+len(repeated)+len(unexpected) == 0 {
		return "", false
	}
	return fmt.Sprintf("%d missing %s, %d too often %s, %d that must not be visible %s",
		len(missing), sample(missing), len(repeated), sample(repeated), len(unexpected), sample(unexpected)), len(repeated)+len(unexpected) > 0
}

func (c *check[T]) visible() []string {
	c.t.Helper()
	ctx, cancel := c.timeout()
	defer cancel()
	v, err := c.sys.Visible(ctx)
	if err != nil {
		c.t.Fatalf("Visible: %v", err)
	}
	return v
}

// visibleNow reads Visible once: it must match what is expected already
// (the negative check: nothing uncommitted is visible).
func (c *check[T]) visibleNow(step string) {
	c.t.Helper()
	if d, _ := c.diff(c.visible()); d != "" {
		c.t.Fatalf("%s: Visible shows %s", step, d)
	}
}

// awaitVisible waits (Features.Timeout) until Visible matches; it fails at
// once when Visible shows too much.
func (c *check[T]) awaitVisible(step string) {
	c.t.Helper()
	deadline := time.Now().Add(c.f.Timeout)
	for {
		d, excess := c.diff(c.visible())
		if d == "" {
			return
		}
		if excess {
			c.t.Fatalf("%s: Visible shows %s", step, d)
		}
		if time.Now().After(deadline) || !sleep(c.ctx, 20*time.Millisecond) {
			c.t.Fatalf("%s: after %v, Visible shows %s", step, c.f.Timeout, d)
		}
	}
}

// settle waits Features.Quiet and checks Visible once more.
func (c *check[T]) settle() {
	c.t.Helper()
	sleep(c.ctx, c.f.Quiet)
	c.visibleNow("at the end of the check")
}

// awaitNoneOpen waits until the external system holds no open transaction
// of the sink (when the System can tell).
func (c *check[T]) awaitNoneOpen(step string) {
	c.t.Helper()
	if c.sys.Open == nil {
		return
	}
	deadline := time.Now().Add(c.f.Timeout)
	for {
		ctx, cancel := c.timeout()
		n, err := c.sys.Open(ctx)
		cancel()
		if err != nil {
			c.t.Fatalf("Open: %v", err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) || !sleep(c.ctx, 20*time.Millisecond) {
			c.t.Fatalf("%s: after %v the external system still holds %d open transactions of the sink", step, c.f.Timeout, n)
		}
	}
}

func (s *suite[T]) testCommitMakesVisible(c *check[T]) {
	a := c.start()
	n := c.f.Records
	e1 := c.write(a, n)
	c.visibleNow("after Write, before PreCommit")
	d1 := c.preCommit(a, 1)
	c.visibleNow("after PreCommit, before Commit")
	c.commit(a, d1, "checkpoint 1")
	c.expect(1, 1, e1...)
	c.awaitVisible("after Commit of checkpoint 1")
	d2 := c.preCommit(a, 2) // an empty epoch
	c.commit(a, d2, "checkpoint 2, an empty epoch")
	c.visibleNow("after Commit of an empty epoch")
	e3 := c.write(a, n)
	d3 := c.preCommit(a, 3)
	c.visibleNow("after PreCommit of checkpoint 3, before its Commit")
	c.commit(a, d3, "checkpoint 3")
	c.expect(1, 1, e3...)
	c.awaitVisible("after Commit of checkpoint 3")
	c.close(a)
	c.settle()
}

func (s *suite[T]) testCommitIdempotent(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	c.commit(a, d1, "checkpoint 1")
	c.commit(a, d1, "checkpoint 1 again")
	c.expect(1, 1, e1...)
	c.awaitVisible("after two Commits of checkpoint 1")
	c.commit(a, d1, "checkpoint 1 a third time")
	e2 := c.write(a, c.f.Records)
	d2 := c.preCommit(a, 2)
	c.visibleNow("after PreCommit of checkpoint 2, before its Commit")
	c.commit(a, d2, "checkpoint 2")
	c.commit(a, d2, "checkpoint 2 again")
	c.expect(1, 1, e2...)
	c.awaitVisible("after two Commits of checkpoint 2")
	c.close(a)
	c.settle()
}

func (s *suite[T]) testSkippedNotification(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	e2 := c.write(a, c.f.Records)
	d2 := c.preCommit(a, 2)
	c.visibleNow("after two PreCommits, before any Commit")
	// Checkpoint 1's notification was lost: checkpoint 2's completion
	// commits both.
	c.commit(a, d1, "checkpoint 1, after checkpoint 2 completed")
	c.commit(a, d2, "checkpoint 2")
	c.expect(1, 1, e1...)
	c.expect(1, 1, e2...)
	c.awaitVisible("after the Commits of checkpoints 1 and 2")
	c.close(a)
	c.settle()
}

func (s *suite[T]) testLateCommit(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	e2 := c.write(a, c.f.Records)
	d2 := c.preCommit(a, 2)
	// The commit of checkpoint 1 failed; it is retried after checkpoint 2.
	c.commit(a, d2, "checkpoint 2, before checkpoint 1")
	c.expect(1, 1, e2...)
	c.awaitVisible("after Commit of checkpoint 2 only")
	c.commit(a, d1, "checkpoint 1, after checkpoint 2")
	c.expect(1, 1, e1...)
	c.awaitVisible("after the late Commit of checkpoint 1")
	e3 := c.write(a, c.f.Records)
	d3 := c.preCommit(a, 3)
	c.commit(a, d3, "checkpoint 3")
	c.expect(1, 1, e3...)
	c.awaitVisible("after Commit of checkpoint 3")
	c.close(a)
	c.settle()
}

func (s *suite[T]) testAbort(c *check[T]) {
	a := c.start()
	c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	c.abort(a, d1, "checkpoint 1")
	c.abort(a, d1, "checkpoint 1 again")
	c.visibleNow("after Abort")
	c.awaitNoneOpen("after Abort")
	e2 := c.write(a, c.f.Records)
	d2 := c.preCommit(a, 2)
	c.commit(a, d2, "checkpoint 2")
	c.expect(1, 1, e2...)
	c.awaitVisible("after Commit of the checkpoint after an aborted one")
	c.close(a)
	c.settle()
}

func (s *suite[T]) testCrashBeforeCommit(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	c.close(a) // crash between the phases
	c.visibleNow("after the instance that pre-committed was closed, before any Commit")
	b := c.start(d1)
	c.commit(b, d1, "checkpoint 1, by a new instance that never saw its PreCommit")
	c.expect(1, 1, e1...)
	c.awaitVisible("after the new instance committed checkpoint 1")
	c.commit(b, d1, "checkpoint 1 again, by the new instance")
	e2 := c.write(b, c.f.Records)
	d2 := c.preCommit(b, 2)
	c.visibleNow("after the new instance's PreCommit, before its Commit")
	c.commit(b, d2, "checkpoint 2")
	c.expect(1, 1, e2...)
	c.awaitVisible("after the new instance committed checkpoint 2")
	c.close(b)
	c.settle()
}

func (s *suite[T]) testCrashAfterCommit(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	c.commit(a, d1, "checkpoint 1")
	c.expect(1, 1, e1...)
	c.awaitVisible("after Commit of checkpoint 1")
	c.close(a) // crash before the runtime recorded the commit
	b := c.start(d1)
	c.commit(b, d1, "checkpoint 1 again, by a new instance")
	c.visibleNow("after the new instance committed checkpoint 1 again")
	c.close(b)
	c.settle()
}

func (s *suite[T]) testCrashWithSkippedNotification(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	e2 := c.write(a, c.f.Records)
	d2 := c.preCommit(a, 2)
	c.close(a) // crash; checkpoint 2 completed and lists both
	b := c.start(d1, d2)
	c.commit(b, d1, "checkpoint 1, by a new instance")
	c.commit(b, d2, "checkpoint 2, by a new instance")
	c.expect(1, 1, e1...)
	c.expect(1, 1, e2...)
	c.awaitVisible("after the new instance committed both")
	c.close(b)
	c.settle()
}

func (s *suite[T]) testRecoverAbortsOthers(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	e2 := c.write(a, c.f.Records)
	c.preCommit(a, 2) // checkpoint 2 never completes
	e3 := c.write(a, c.f.Records)
	c.close(a) // crash with epoch 3 open
	b := c.start(d1)
	c.commit(b, d1, "checkpoint 1, by a new instance")
	c.expect(1, 1, e1...)
	c.awaitVisible("after the new instance recovered and committed checkpoint 1 only")
	c.awaitNoneOpen("after Recover and the Commit of the recovered transaction")
	c.visibleNow("after the other transactions of the crashed instance were resolved")
	// The job replays the records after checkpoint 1, and the restarted
	// job's next checkpoint reuses id 2.
	c.writeKeys(b, e2)
	c.writeKeys(b, e3)
	d2 := c.preCommit(b, 2)
	c.visibleNow("after the new instance pre-committed the replayed records")
	c.commit(b, d2, "checkpoint 2 of the new instance")
	c.expect(1, 1, e2...)
	c.expect(1, 1, e3...)
	c.awaitVisible("after the new instance committed the replayed records")
	c.close(b)
	c.settle()
}

func (s *suite[T]) testAsyncCommit(c *check[T]) {
	a := c.start()
	if a.async == nil {
		c.t.Skip("sinktest: the sink does not implement sink.AsyncCommitter")
	}
	ctx, cancel := c.timeout()
	defer cancel()
	e1 := c.write(a, c.f.Records)
	d1 := c.preCommit(a, 1)
	if err := a.async.StartCommit(ctx, d1); err != nil {
		c.t.Fatalf("StartCommit (checkpoint 1): %v", err)
	}
	e2 := c.write(a, c.f.Records) // the next epoch, while 1 commits
	if err := a.async.WaitCommits(ctx); err != nil {
		c.t.Fatalf("WaitCommits (checkpoint 1): %v", err)
	}
	c.expect(1, 1, e1...)
	c.awaitVisible("after WaitCommits of checkpoint 1")
	if err := a.async.StartCommit(ctx, d1); err != nil {
		c.t.Fatalf("StartCommit (checkpoint 1 again): %v", err)
	}
	if err := a.async.WaitCommits(ctx); err != nil {
		c.t.Fatalf("WaitCommits (checkpoint 1 again): %v", err)
	}
	c.visibleNow("after a repeated StartCommit of checkpoint 1")
	d2 := c.preCommit(a, 2)
	c.visibleNow("after PreCommit of checkpoint 2, before its commit")
	if err := a.async.StartCommit(ctx, d2); err != nil {
		c.t.Fatalf("StartCommit (checkpoint 2): %v", err)
	}
	c.close(a) // crash before WaitCommits
	b := c.start(d2)
	c.commit(b, d2, "checkpoint 2, by a new instance")
	c.expect(1, 1, e2...)
	c.awaitVisible("after the new instance committed checkpoint 2")
	c.close(b)
	c.settle()
}

func (s *suite[T]) testFlushMakesVisible(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	c.flush(a)
	c.expect(1, 1, e1...)
	c.awaitVisible("after Flush")
	c.flush(a) // nothing written
	c.visibleNow("after a Flush with nothing written")
	e2 := c.write(a, c.f.Records)
	c.flush(a)
	c.expect(1, 1, e2...)
	c.awaitVisible("after the second Flush")
	c.close(a)
	c.settle()
}

func (s *suite[T]) testFlushedSurvivesCrash(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	c.flush(a)
	c.expect(1, 1, e1...)
	c.awaitVisible("after Flush")
	e2 := c.write(a, c.f.Records) // not flushed
	c.close(a)                    // crash
	c.expect(0, 1, e2...)
	b := c.start()
	c.visibleNow("after a crash and a new instance")
	c.writeKeys(b, e2) // the job replays what its checkpoint did not cover
	c.flush(b)
	if c.f.Idempotent {
		c.expect(1, 1, e2...)
	} else {
		c.expect(1, 2, e2...)
	}
	c.awaitVisible("after the new instance wrote the unflushed records again and flushed")
	c.close(b)
	c.settle()
}

func (s *suite[T]) testReplay(c *check[T]) {
	a := c.start()
	e1 := c.write(a, c.f.Records)
	c.flush(a)
	c.expect(1, 1, e1...)
	c.awaitVisible("after Flush")
	c.close(a) // crash before the checkpoint of that Flush completed
	b := c.start()
	c.writeKeys(b, e1)
	c.flush(b)
	if c.f.Idempotent {
		c.expect(1, 1, e1...)
	} else {
		c.expect(1, 2, e1...)
	}
	c.awaitVisible("after a new instance wrote the flushed records again and flushed")
	c.close(b)
	c.settle()
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// sample renders up to 8 keys, sorted.
func sample(keys []string) string {
	if len(keys) == 0 {
		return "[]"
	}
	s := slices.Clone(keys)
	sort.Strings(s)
	const n = 8
	if len(s) > n {
		return fmt.Sprintf("[%s … (%d more)]", strings.Join(s[:n], " "), len(s)-n)
	}
	return "[" + strings.Join(s, " ") + "]"
}
