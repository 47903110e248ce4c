package sourcetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/source"
)

// Features says how the source under test differs from the plain case: an
// unbounded source that restores exactly.
type Features struct {
	// Bounded says the splits end: after the records an instance holds
	// when it is made, every split returns source.ErrEndOfSplit. Produce
	// is then not used, and AddSplits is called before the new splits are
	// opened.
	Bounded bool
	// Endless says every split always has another record (a generator):
	// Instance.Records and Produce are not used, and the suite reads
	// Records records from each split.
	Endless bool
	// AtLeastOnce says a reader opened at a restored offset may return
	// records again that were returned before that offset was read, in
	// any order: the source cannot seek, and the system redelivers what
	// the job did not acknowledge (source/wmsource). It must still return
	// every record after the offset. Reads without a restore are still
	// exactly once.
	AtLeastOnce bool
	// Records is the number of records each instance holds (Endless: the
	// number read from each split). Default 24.
	Records int
	// Timeout bounds each wait for records, splits or a call (default
	// 30 s).
	Timeout time.Duration
	// Prompt bounds how long a Poll may take to return after its ctx ended
	// (default 5 s: far more than a correct source needs, so that a
	// loaded machine does not fail the check).
	Prompt time.Duration
	// Quiet is how long the suite polls for records that must not come
	// (default 50 ms). It can only miss a bug, never report a false one.
	Quiet time.Duration
}

func (f Features) withDefaults() Features {
	if f.Records <= 0 {
		f.Records = 24
	}
	if f.Timeout <= 0 {
		f.Timeout = 30 * time.Second
	}
	if f.Prompt <= 0 {
		f.Prompt = 5 * time.Second
	}
	if f.Quiet <= 0 {
		f.Quiet = 50 * time.Millisecond
	}
	return f
}

// Instance is one source under test and the means to feed it, made by the
// caller's factory for one check.
type Instance[T any] struct {
	// Source is the source under test.
	Source source.Source[T]
	// Key returns the key of a record's value: unique among the records
	// the instance ever holds. It is called on the goroutine that polled
	// the record, before the next Poll.
	Key func(T) string
	// Records are the keys of the records the instance holds when it is
	// made: all a bounded source's splits will return (not used when
	// Features.Endless).
	Records []string
	// Produce, when not nil, makes n more records appear in the source's
	// splits (spread as the system spreads them) and returns their keys.
	// The suite calls it from the test goroutine. It is needed by the
	// PollHonoursContext check; Bounded sources do not need it.
	Produce func(ctx context.Context, n int) ([]string, error)
	// AddSplits, when not nil, adds at least one split to the system
	// (a queue to the topic), puts records in the new splits only, and
	// returns their keys. It is needed by the Discovery check of sources
	// implementing source.Discoverer.
	AddSplits func(ctx context.Context) ([]string, error)
}

// Factory makes a new Instance holding records records (see Instance). It
// is called once for every check, on that check's subtest.
type Factory[T any] func(t *testing.T, records int) Instance[T]

// Run runs the conformance suite on the sources newInstance makes, each
// check in a subtest of t (see the package documentation). It blocks until
// every check is done.
func Run[T any](t *testing.T, f Features, newInstance Factory[T]) {
	t.Helper()
	if f.Bounded && f.Endless {
		t.Fatal("sourcetest: Features.Bounded and Features.Endless exclude each other")
	}
	s := &suite[T]{f: f.withDefaults(), factory: newInstance}
	t.Run("Splits", s.testSplits)
	t.Run("ReadAll", s.testReadAll)
	t.Run("CancelledPolls", s.testCancelledPolls)
	t.Run("PollHonoursContext", s.testPollHonoursContext)
	t.Run("Restore", s.testRestore)
	t.Run("BadOffset", s.testBadOffset)
	t.Run("Discovery", s.testDiscovery)
}

type suite[T any] struct {
	f       Features
	factory Factory[T]
}

// session is one check's instance and the readers it opened.
type session[T any] struct {
	t    *testing.T
	s    *suite[T]
	inst Instance[T]
	ctx  context.Context // ends with the check
	// readers the check opened, closed at its end if it did not close them.
	readers []*reading[T]
}

func (s *suite[T]) start(t *testing.T) *session[T] {
	t.Helper()
	inst := s.factory(t, s.f.Records)
	switch {
	case inst.Source == nil:
		t.Fatal("sourcetest: the factory returned no Source")
	case inst.Key == nil:
		t.Fatal("sourcetest: the factory returned no Key function")
	case !s.f.Endless && len(inst.Records) == 0:
		t.Fatal("sourcetest: the factory returned an instance holding no records")
	}
	if dup := duplicates(inst.Records); len(dup) > 0 {
		t.Fatalf("sourcetest: the factory's record keys repeat: %s", sample(dup))
	}
	ctx, cancel := context.WithCancel(context.Background())
	ss := &session[T]{t: t, s: s, inst: inst, ctx: ctx}
	t.Cleanup(func() {
		for _, rd := range ss.readers {
			if !rd.closed && !rd.hung {
				rd.closed = true
				_ = rd.r.Close() // the check failed before closing it
			}
		}
		cancel()
	})
	return ss
}

// timeout returns a ctx of the check ending after Features.Timeout.
func (ss *session[T]) timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(ss.ctx, ss.s.f.Timeout)
}

// splits lists the instance's splits (checked non-empty and unique).
func (ss *session[T]) splits() []source.Split {
	ss.t.Helper()
	ctx, cancel := ss.timeout()
	defer cancel()
	splits, err := ss.inst.Source.Splits(ctx)
	if err != nil {
		ss.t.Fatalf("Splits: %v", err)
	}
	if len(splits) == 0 {
		ss.t.Fatal("Splits listed no split")
	}
	seen := map[string]bool{}
	for _, sp := range splits {
		if sp.ID == "" {
			ss.t.Fatalf("Splits listed a split with an empty ID: %v", splits)
		}
		if seen[sp.ID] {
			ss.t.Fatalf("Splits listed split %q twice: %v", sp.ID, splits)
		}
		seen[sp.ID] = true
	}
	return splits
}

// open opens split at off (nil: the start position); off is copied first,
// so the caller's slice is never handed to the source.
func (ss *session[T]) open(split source.Split, off []byte) *reading[T] {
	ss.t.Helper()
	if off != nil {
		off = bytes.Clone(off)
	}
	ctx, cancel := ss.timeout()
	defer cancel()
	r, err := ss.inst.Source.Open(ctx, split, off)
	if err != nil {
		ss.t.Fatalf("Open(split %s, offset %x): %v", split.ID, off, err)
	}
	if r == nil {
		ss.t.Fatalf("Open(split %s) returned a nil reader", split.ID)
	}
	rd := &reading[T]{split: split.ID, r: r}
	ss.readers = append(ss.readers, rd)
	return rd
}

// close closes rd (once) and fails the check if Close fails.
func (ss *session[T]) close(rd *reading[T]) {
	ss.t.Helper()
	if rd.closed || rd.hung {
		return
	}
	rd.closed = true
	if err := rd.r.Close(); err != nil {
		ss.t.Errorf("split %s: Close: %v", rd.name(), err)
	}
}

// reading is one open reader and what it returned.
type reading[T any] struct {
	split  string
	label  string // what messages call it, when not the split ID
	r      source.SplitReader[T]
	seq    []string // keys in the order returned
	offs   [][]byte // copy of each record's Offset (nil when it had none)
	notes  []note   // Offset values noted
	ended  bool     // ErrEndOfSplit seen
	hung   bool     // a call did not return in time: never touch r again
	closed bool
	// A reader opened at a restore point of an exactly restoring source
	// must return expect, the records after the first at, in order.
	expect []string
	at     int
	from   []byte
}

// mismatch reports the first record of rd.seq[from:] that breaks
// rd.expect.
func (rd *reading[T]) mismatch(from int) error {
	if rd.expect == nil {
		return nil
	}
	for j := from; j < len(rd.seq); j++ {
		if j >= len(rd.expect) || rd.seq[j] != rd.expect[j] {
			return fmt.Errorf("a reader opened at offset %x returned %s, want the %d records after the first %d: %s",
				rd.from, sample(rd.seq), len(rd.expect), rd.at, sample(rd.expect))
		}
	}
	return nil
}

func (rd *reading[T]) name() string {
	if rd.label != "" {
		return rd.label
	}
	return rd.split
}

// note is an Offset value noted after some records.
type note struct {
	at   int    // records returned before it
	held []byte // the slice Offset returned, kept untouched
	want []byte // a copy made when it was returned
	why  string
}

// plan says how collect polls.
type plan struct {
	maxes     []int // max of successive polls, cycled
	cancelled bool  // precede every poll by one with a cancelled ctx
	note      bool  // note Offset and notify a checkpoint after every poll
	per       int   // Endless: records to read from each split
	noQuiet   bool  // do not poll for extra records once every wanted key came
}

// progress counts, across the readers of one collect, the wanted keys seen.
type progress struct {
	mu   sync.Mutex
	want map[string]bool
	seen map[string]bool
	done chan struct{} // closed once every wanted key was seen
}

func newProgress(want []string) *progress {
	p := &progress{want: make(map[string]bool, len(want)), seen: map[string]bool{}, done: make(chan struct{})}
	for _, k := range want {
		p.want[k] = true
	}
	if len(p.want) == 0 {
		close(p.done)
	}
	return p
}

func (p *progress) add(keys []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := len(p.seen)
	for _, k := range keys {
		if p.want[k] {
			p.seen[k] = true
		}
	}
	if before < len(p.want) && len(p.seen) == len(p.want) {
		close(p.done)
	}
}

func (p *progress) complete() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pollWait bounds the polls of unbounded readers in collect, so that they
// notice that the wanted records all arrived.
const pollWait = 100 * time.Millisecond

// collect polls every reader in rs on a goroutine of its own until: a
// bounded reader ended (and its end is sticky), an Endless reader returned
// p.per records, and the unbounded readers together returned every key of
// want; then it polls the unbounded readers for Features.Quiet more. It
// fails the check on any breach of the reader contract; the caller checks
// what was returned.
func (ss *session[T]) collect(rs []*reading[T], want []string, p plan) {
	ss.t.Helper()
	f := ss.s.f
	prog := newProgress(want)
	ctx, cancel := context.WithTimeout(ss.ctx, f.Timeout)
	defer cancel()
	errs := make([]error, len(rs))
	finished := make([]chan struct{}, len(rs))
	for i, rd := range rs {
		finished[i] = make(chan struct{})
		go func() {
			defer close(finished[i])
			errs[i] = ss.readLoop(ctx, rd, p, prog)
		}()
	}
	limit := time.NewTimer(f.Timeout + 2*f.Prompt)
	defer limit.Stop()
	for i, rd := range rs {
		select {
		case <-finished[i]:
		case <-limit.C:
			for j := i; j < len(rs); j++ {
				select {
				case <-finished[j]:
				default:
					rs[j].hung = true
					ss.t.Errorf("split %s: a reader call did not return within %v", rs[j].name(), f.Timeout+2*f.Prompt)
				}
			}
			ss.t.FailNow()
		}
		if errs[i] != nil {
			ss.t.Errorf("split %s: %v", rd.name(), errs[i])
		}
	}
	if ss.t.Failed() {
		ss.t.FailNow()
	}
	if !f.Bounded && !f.Endless && !prog.complete() {
		ss.t.Fatalf("after %v the readers had not returned every record: %s", f.Timeout, describe(rs, want))
	}
	for _, rd := range rs {
		switch {
		case f.Bounded && !rd.ended:
			ss.t.Fatalf("split %s of a bounded source never returned ErrEndOfSplit within %v (%s)", rd.name(), f.Timeout, describe(rs, want))
		case f.Endless && len(rd.seq) < p.per:
			ss.t.Fatalf("split %s of an endless source returned %d records within %v, want %d", rd.name(), len(rd.seq), f.Timeout, p.per)
		}
	}
}

// readLoop is collect's loop for one reader.
func (ss *session[T]) readLoop(ctx context.Context, rd *reading[T], p plan, prog *progress) error {
	f := ss.s.f
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; ; i++ {
		switch {
		case f.Bounded && rd.ended:
			return ss.checkSticky(ctx, rd)
		case f.Endless && len(rd.seq) >= p.per:
			return nil
		case !f.Bounded && !f.Endless && prog.complete():
			if p.noQuiet {
				return nil
			}
			return ss.quiet(ctx, rd, prog)
		case ctx.Err() != nil:
			return nil // collect reports what is missing
		}
		n := p.maxes[i%len(p.maxes)]
		if f.Endless {
			n = min(n, p.per-len(rd.seq))
		}
		if p.cancelled {
			if err := ss.poll(cancelled, rd, n, prog); err != nil {
				return err
			}
			if p.note {
				if err := ss.noteOffset(ctx, rd, "after a cancelled Poll"); err != nil {
					return err
				}
			}
			if rd.ended || (f.Endless && len(rd.seq) >= p.per) {
				continue
			}
			if f.Endless {
				n = min(n, p.per-len(rd.seq))
			}
		}
		pctx, pcancel := context.WithTimeout(ctx, pollWait)
		before := len(rd.seq)
		err := ss.poll(pctx, rd, n, prog)
		pcancel()
		if err != nil {
			return err
		}
		if p.note && len(rd.seq) > before {
			if err := ss.noteOffset(ctx, rd, "after a Poll"); err != nil {
				return err
			}
		}
	}
}

// poll calls Poll once and checks the result against the contract.
func (ss *session[T]) poll(ctx context.Context, rd *reading[T], n int, prog *progress) error {
	f := ss.s.f
	start := time.Now()
	recs, err := rd.r.Poll(ctx, n)
	took := time.Since(start)
	if dl, ok := ctx.Deadline(); ok && took > dl.Sub(start)+f.Prompt {
		return fmt.Errorf("Poll took %v, %v after its ctx ended (Features.Prompt %v)", took, took-dl.Sub(start), f.Prompt)
	} else if !ok && ctx.Err() != nil && took > f.Prompt {
		return fmt.Errorf("Poll with a cancelled ctx took %v (Features.Prompt %v)", took, f.Prompt)
	}
	if len(recs) > n {
		return fmt.Errorf("Poll(max %d) returned %d records", n, len(recs))
	}
	keys := make([]string, len(recs))
	for i := range recs {
		keys[i] = ss.inst.Key(recs[i].Value)
		var off []byte
		if len(recs[i].Offset) > 0 {
			off = bytes.Clone(recs[i].Offset)
		}
		rd.offs = append(rd.offs, off)
	}
	rd.seq = append(rd.seq, keys...)
	prog.add(keys)
	if err := rd.mismatch(len(rd.seq) - len(keys)); err != nil {
		return err
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, source.ErrEndOfSplit):
		if len(recs) > 0 {
			return fmt.Errorf("Poll returned ErrEndOfSplit with %d records (it must come with none)", len(recs))
		}
		if !f.Bounded {
			return fmt.Errorf("Poll of an unbounded split returned %v (declare Features.Bounded?)", err)
		}
		rd.ended = true
		return nil
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return nil
	case ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return fmt.Errorf("Poll returned %v while its ctx was live", err)
	}
	return fmt.Errorf("Poll: %w", err)
}

// checkSticky polls an ended bounded reader twice more: ErrEndOfSplit with
// no records each time.
func (ss *session[T]) checkSticky(ctx context.Context, rd *reading[T]) error {
	for range 2 {
		recs, err := rd.r.Poll(ctx, 10)
		if len(recs) > 0 || !errors.Is(err, source.ErrEndOfSplit) {
			return fmt.Errorf("Poll after ErrEndOfSplit returned %d records and %v: the end is not sticky", len(recs), err)
		}
	}
	return nil
}

// quiet polls an unbounded reader for Features.Quiet, counting whatever it
// returns (the caller's check then finds the extra records).
func (ss *session[T]) quiet(ctx context.Context, rd *reading[T], prog *progress) error {
	qctx, cancel := context.WithTimeout(ctx, ss.s.f.Quiet)
	defer cancel()
	for qctx.Err() == nil {
		if err := ss.poll(qctx, rd, 100, prog); err != nil {
			return err
		}
	}
	return nil
}

// noteOffset notes rd's Offset, checks that a second call returns the
// same, that scribbling over the second changes nothing, and tells the
// reader the checkpoint completed.
func (ss *session[T]) noteOffset(ctx context.Context, rd *reading[T], why string) error {
	held := rd.r.Offset()
	want := bytes.Clone(held)
	again := rd.r.Offset()
	if !bytes.Equal(again, want) {
		return fmt.Errorf("two Offset calls with no Poll between returned %x and %x", want, again)
	}
	for i := range again {
		again[i] ^= 0xff // the caller owns it
	}
	if third := rd.r.Offset(); !bytes.Equal(third, want) {
		return fmt.Errorf("Offset changed from %x to %x when the caller changed the bytes a previous Offset returned: the reader must not keep them", want, third)
	}
	rd.notes = append(rd.notes, note{at: len(rd.seq), held: held, want: want, why: why})
	if err := rd.r.NotifyCheckpointComplete(ctx, uint64(len(rd.notes))); err != nil {
		return fmt.Errorf("NotifyCheckpointComplete: %w", err)
	}
	return nil
}

// checkOwned fails the check when a reader changed a slice Offset returned
// earlier.
func (ss *session[T]) checkOwned(rs []*reading[T]) {
	ss.t.Helper()
	for _, rd := range rs {
		for _, n := range rd.notes {
			if !bytes.Equal(n.held, n.want) {
				ss.t.Errorf("split %s: the offset %x returned %s after %d records changed to %x later: Offset's slice belongs to the caller", rd.name(), n.want, n.why, n.at, n.held)
			}
		}
	}
}

// exactlyOnce fails the check unless the readers returned every key of
// want exactly once and nothing else.
func (ss *session[T]) exactlyOnce(rs []*reading[T], want []string, what string) {
	ss.t.Helper()
	got := map[string]int{}
	for _, rd := range rs {
		for _, k := range rd.seq {
			got[k]++
		}
	}
	wanted := map[string]bool{}
	for _, k := range want {
		wanted[k] = true
	}
	var missing, repeated, unexpected []string
	for _, k := range want {
		if got[k] == 0 {
			missing = append(missing, k)
		}
	}
	for k, n := range got {
		switch {
		case !wanted[k]:
			unexpected = append(unexpected, k)
		case n > 1:
			repeated = append(repeated, fmt.Sprintf("%s ×%d", k, n))
		}
	}
	if len(missing)+len(repeated)+len(unexpected) > 0 {
		ss.t.Fatalf("%s: %d records missing %s, %d repeated %s, %d unexpected %s (%s)", what,
			len(missing), sample(missing), len(repeated), sample(repeated), len(unexpected), sample(unexpected), describe(rs, nil))
	}
}

// distinct fails the check when the readers returned a key twice (Endless
// sources).
func (ss *session[T]) distinct(rs []*reading[T], what string) {
	ss.t.Helper()
	var all []string
	for _, rd := range rs {
		all = append(all, rd.seq...)
	}
	if dup := duplicates(all); len(dup) > 0 {
		ss.t.Fatalf("%s: records returned more than once: %s", what, sample(dup))
	}
}

// openAll opens every split at nil.
func (ss *session[T]) openAll(splits []source.Split) []*reading[T] {
	ss.t.Helper()
	rs := make([]*reading[T], len(splits))
	for i, sp := range splits {
		rs[i] = ss.open(sp, nil)
	}
	return rs
}

// readAll collects every record of the instance from rs with p.
func (ss *session[T]) readAll(rs []*reading[T], p plan, what string) {
	ss.t.Helper()
	f := ss.s.f
	if f.Endless {
		p.per = f.Records
		ss.collect(rs, nil, p)
		ss.distinct(rs, what)
		return
	}
	ss.collect(rs, ss.inst.Records, p)
	ss.exactlyOnce(rs, ss.inst.Records, what)
}

func (s *suite[T]) testSplits(t *testing.T) {
	ss := s.start(t)
	first := ss.splits()
	second := ss.splits()
	if !slices.Equal(first, second) {
		t.Fatalf("Splits is not stable: %v, then %v", first, second)
	}
}

func (s *suite[T]) testReadAll(t *testing.T) {
	ss := s.start(t)
	rs := ss.openAll(ss.splits())
	ss.readAll(rs, plan{maxes: []int{s.f.Records}}, "read from the start")
	for _, rd := range rs {
		ss.close(rd)
	}
}

func (s *suite[T]) testCancelledPolls(t *testing.T) {
	ss := s.start(t)
	rs := ss.openAll(ss.splits())
	ss.readAll(rs, plan{maxes: []int{5}, cancelled: true, note: true}, "read with cancelled polls")
	ss.checkOwned(rs)
	for _, rd := range rs {
		ss.close(rd)
	}
	ss.restoreFrom(rs, false)
}

func (s *suite[T]) testPollHonoursContext(t *testing.T) {
	f := s.f
	if f.Bounded || f.Endless {
		t.Skip("sourcetest: only for unbounded sources that can run dry")
	}
	ss := s.start(t)
	if ss.inst.Produce == nil {
		t.Skip("sourcetest: the instance has no Produce function")
	}
	rs := ss.openAll(ss.splits())
	ss.readAll(rs, plan{maxes: []int{f.Records}}, "read from the start")
	prog := newProgress(nil)
	for _, rd := range rs {
		before := len(rd.seq)
		for _, d := range []time.Duration{0, 20 * time.Millisecond} {
			ctx, cancel := context.WithTimeout(ss.ctx, d)
			err := ss.poll(ctx, rd, 10, prog)
			cancel()
			if err != nil {
				t.Fatalf("split %s, drained: %v", rd.name(), err)
			}
		}
		if len(rd.seq) > before {
			t.Fatalf("split %s returned %d records after it was drained: %q", rd.name(), len(rd.seq)-before, rd.seq[before:])
		}
	}
	pctx, pcancel := ss.timeout()
	more, err := ss.inst.Produce(pctx, f.Records)
	pcancel()
	if err != nil {
		t.Fatalf("Produce: %v", err)
	}
	if len(more) == 0 {
		t.Fatal("sourcetest: Produce returned no keys")
	}
	all := append(slices.Clone(ss.inst.Records), more...)
	if dup := duplicates(all); len(dup) > 0 {
		t.Fatalf("sourcetest: Produce returned keys already used: %s", sample(dup))
	}
	ss.collect(rs, more, plan{maxes: []int{f.Records}})
	ss.exactlyOnce(rs, all, "records produced after the splits ran dry")
	for _, rd := range rs {
		ss.close(rd)
	}
}

func (s *suite[T]) testRestore(t *testing.T) {
	ss := s.start(t)
	splits := ss.splits()
	rs := make([]*reading[T], len(splits))
	ctx, cancel := ss.timeout()
	defer cancel()
	for i, sp := range splits {
		rs[i] = ss.open(sp, nil)
		if err := ss.noteOffset(ctx, rs[i], "before the first Poll"); err != nil {
			t.Fatalf("split %s: %v", sp.ID, err)
		}
	}
	ss.readAll(rs, plan{maxes: []int{1, 2, 3}, note: true}, "read in small batches")
	ss.checkOwned(rs)
	for _, rd := range rs {
		ss.close(rd)
	}
	ss.restoreFrom(rs, true)
}

// point is a restore point of a split: open at off, and the reader must
// return what followed the at-th record.
type point struct {
	at  int
	off []byte
	why string
}

// restoreFrom opens a new reader at every restore point the readings in rs
// noted (and, with recordOffsets, at every Record.Offset) and checks that
// it resumes there.
func (ss *session[T]) restoreFrom(rs []*reading[T], recordOffsets bool) {
	ss.t.Helper()
	for _, rd := range rs {
		var pts []point
		seen := map[string]bool{}
		addPoint := func(p point) {
			k := fmt.Sprintf("%d/%x", p.at, p.off)
			if !seen[k] {
				seen[k] = true
				pts = append(pts, p)
			}
		}
		for _, n := range rd.notes {
			addPoint(point{at: n.at, off: n.want, why: "Offset " + n.why})
		}
		if recordOffsets {
			for i, off := range rd.offs {
				if off != nil {
					addPoint(point{at: i + 1, off: off, why: "the Record.Offset of record " + rd.seq[i]})
				}
			}
		}
		for _, p := range pts {
			ss.restoreAt(rd, p)
		}
	}
}

// restoreAt opens rd's split at p and checks what the new reader returns.
func (ss *session[T]) restoreAt(rd *reading[T], p point) {
	ss.t.Helper()
	f := ss.s.f
	rest := rd.seq[p.at:]
	r := ss.open(source.Split{ID: rd.split}, p.off)
	r.label = fmt.Sprintf("%s restored after %d records (at %s)", rd.split, p.at, p.why)
	defer ss.close(r)
	if !f.AtLeastOnce {
		r.expect, r.at, r.from = rest, p.at, p.off
	}
	switch {
	case f.Endless:
		ss.collect([]*reading[T]{r}, nil, plan{maxes: []int{f.Records}, per: len(rest)})
	case f.AtLeastOnce:
		ss.collect([]*reading[T]{r}, rest, plan{maxes: []int{f.Records}, noQuiet: true})
		all := map[string]bool{}
		for _, k := range ss.inst.Records {
			all[k] = true
		}
		var foreign []string
		for _, k := range r.seq {
			if !all[k] {
				foreign = append(foreign, k)
			}
		}
		if len(foreign) > 0 {
			ss.t.Fatalf("split %s returned records that are not the instance's: %s", r.name(), sample(foreign))
		}
		return
	default:
		ss.collect([]*reading[T]{r}, rest, plan{maxes: []int{f.Records}})
	}
	if !slices.Equal(r.seq, rest) {
		ss.t.Fatalf("split %s: a reader opened at offset %x returned %s, want the %d records after the first %d: %s",
			r.name(), p.off, sample(r.seq), len(rest), p.at, sample(rest))
	}
}

func (s *suite[T]) testBadOffset(t *testing.T) {
	ss := s.start(t)
	splits := ss.splits()
	bad := []byte("sourcetest: not an offset of this source")
	ctx, cancel := ss.timeout()
	defer cancel()
	r, err := ss.inst.Source.Open(ctx, splits[0], bad)
	if err == nil {
		if r != nil {
			_ = r.Close()
		}
		t.Fatalf("Open(split %s, %q) succeeded: a corrupt offset must fail with source.ErrBadOffset", splits[0].ID, bad)
	}
	if !errors.Is(err, source.ErrBadOffset) {
		t.Fatalf("Open(split %s, %q) = %v, want an error wrapping source.ErrBadOffset", splits[0].ID, bad, err)
	}
}

func (s *suite[T]) testDiscovery(t *testing.T) {
	ss := s.start(t)
	d, ok := ss.inst.Source.(source.Discoverer)
	if !ok {
		t.Skip("sourcetest: the source does not implement source.Discoverer")
	}
	splits := ss.splits()
	ctx, cancel := ss.timeout()
	defer cancel()
	listed, err := d.DiscoverSplits(ctx)
	if err != nil {
		t.Fatalf("DiscoverSplits: %v", err)
	}
	has := map[string]bool{}
	for _, sp := range listed {
		has[sp.ID] = true
	}
	for _, sp := range splits {
		if !has[sp.ID] {
			t.Fatalf("DiscoverSplits %v does not list split %s of Splits %v", listed, sp.ID, splits)
		}
	}
	if ss.inst.AddSplits == nil {
		t.Skip("sourcetest: the instance has no AddSplits function")
	}
	old := ss.openAll(splits)
	ss.readAll(old, plan{maxes: []int{s.f.Records}}, "read from the start")
	ctx, cancel = ss.timeout()
	defer cancel()
	keys, err := ss.inst.AddSplits(ctx)
	if err != nil {
		t.Fatalf("AddSplits: %v", err)
	}
	var added []source.Split
	deadline := time.Now().Add(s.f.Timeout)
	ctx, cancel = context.WithTimeout(ss.ctx, 2*s.f.Timeout)
	defer cancel()
	for {
		listed, err = d.DiscoverSplits(ctx)
		if err != nil {
			t.Fatalf("DiscoverSplits: %v", err)
		}
		added = added[:0]
		for _, sp := range listed {
			if !has[sp.ID] {
				added = append(added, sp)
			}
		}
		if len(added) > 0 {
			break
		}
		if time.Now().After(deadline) || !sleep(ctx, 20*time.Millisecond) {
			t.Fatalf("DiscoverSplits listed no new split %v after AddSplits: %v", s.f.Timeout, listed)
		}
	}
	news := ss.openAll(added)
	for _, rd := range old {
		rd.seq, rd.offs = rd.seq[:0], rd.offs[:0] // only what comes now counts
	}
	if s.f.Endless {
		ss.collect(news, nil, plan{maxes: []int{s.f.Records}, per: s.f.Records})
		ss.distinct(news, "read from discovered splits")
	} else {
		ss.collect(append(slices.Clone(old), news...), keys, plan{maxes: []int{s.f.Records}})
		ss.exactlyOnce(append(old, news...), keys, "records of the discovered splits")
	}
	for _, rd := range append(old, news...) {
		ss.close(rd)
	}
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

// duplicates returns the keys that occur more than once in keys.
func duplicates(keys []string) []string {
	seen := make(map[string]int, len(keys))
	var dup []string
	for _, k := range keys {
		seen[k]++
		if seen[k] == 2 {
			dup = append(dup, k)
		}
	}
	return dup
}

// sample renders up to 8 keys.
func sample(keys []string) string {
	if len(keys) == 0 {
		return "[]"
	}
	const n = 8
	s := slices.Clone(keys)
	if len(s) > n {
		return fmt.Sprintf("%q … (%d more)", s[:n], len(s)-n)
	}
	return fmt.Sprintf("%q", s)
}

// describe renders what each reader returned, and what of want is missing.
func describe[T any](rs []*reading[T], want []string) string {
	var b strings.Builder
	seen := map[string]bool{}
	for i, rd := range rs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "split %s returned %d: %s", rd.name(), len(rd.seq), sample(rd.seq))
		for _, k := range rd.seq {
			seen[k] = true
		}
	}
	var missing []string
	for _, k := range want {
		if !seen[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		fmt.Fprintf(&b, "; missing %d: %s", len(missing), sample(missing))
	}
	return b.String()
}
