package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Unit tests of the lane committer's scheduling (laneCommitter.endAll)
// against fakeEnd, a fake END_TRANSACTION sender: they test the order of
// requests per lane, their retries and the hand-over of failed lanes, which
// a real broker cannot be made to answer in a chosen order. What the
// broker does with the requests is tested against the real broker
// (exactly_endretry_test.go).

// fakeCall is one END_TRANSACTION the committer sent to fakeEnd.
type fakeCall struct {
	msgID    string
	lane     uint32
	commit   bool
	async    bool // EndTransactionAsync (the pipeline), else EndTransaction
	deadline bool // its ctx had a deadline
	err      error
}

// fakeEnd is an endSender that records every END_TRANSACTION and answers
// it as scripted: the errors of a handle's successive attempts (then nil),
// after a delay of minDelay plus a random part up to maxDelay (so that
// lanes' answers arrive out of order), pipelined answers from goroutines of
// its own, held until hold is closed, or, with syncAnswers, before
// EndTransactionAsync returns (as the producer does for a request that
// fails before it is sent). A synchronous request fails with ctx's error
// when ctx is done, as the client's do. It checks that a lane never has two
// requests in flight.
type fakeEnd struct {
	t           *testing.T
	lanes       map[string]uint32 // msgID -> lane
	minDelay    time.Duration
	maxDelay    time.Duration
	syncAnswers bool
	hold        chan struct{} // non-nil: pipelined answers wait until it is closed

	wg sync.WaitGroup // answer goroutines
	mu sync.Mutex
	// script[msgID] are the errors of its next attempts.
	script   map[string][]error
	forever  map[string]error // msgID -> error of every attempt
	calls    []fakeCall
	applied  []string // accepted ENDs (nil error), in the order answered
	inflight map[uint32]int
	total    int // requests in flight, all lanes
	maxTotal int
	rnd      *rand.Rand
}

func newFakeEnd(t *testing.T, hs []txnHandle) *fakeEnd {
	f := &fakeEnd{t: t, lanes: make(map[string]uint32, len(hs)), script: map[string][]error{}, forever: map[string]error{},
		inflight: map[uint32]int{}, rnd: rand.New(rand.NewPCG(1, 2))}
	for _, h := range hs {
		f.lanes[h.h.MsgID] = h.lane
	}
	t.Cleanup(f.wg.Wait)
	return f
}

// begin records a request and returns its scripted answer.
func (f *fakeEnd) begin(ctx context.Context, h client.TxHandle, commit, async bool) (uint32, error, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.lanes[h.MsgID]
	if !ok {
		f.t.Errorf("END_TRANSACTION of unknown half message %q", h.MsgID)
	}
	f.inflight[l]++
	if f.inflight[l] > 1 {
		f.t.Errorf("lane %d: %d END_TRANSACTIONs in flight (at %s)", l, f.inflight[l], h.MsgID)
	}
	f.total++
	f.maxTotal = max(f.maxTotal, f.total)
	var err error
	if e, ok := f.forever[h.MsgID]; ok {
		err = e
	} else if s := f.script[h.MsgID]; len(s) > 0 {
		err, f.script[h.MsgID] = s[0], s[1:]
	}
	_, dl := ctx.Deadline()
	f.calls = append(f.calls, fakeCall{msgID: h.MsgID, lane: l, commit: commit, async: async, deadline: dl, err: err})
	d := f.minDelay
	if f.maxDelay > 0 {
		d += time.Duration(f.rnd.Int64N(int64(f.maxDelay)))
	}
	return l, err, d
}

// end records the answer of a request of lane l.
func (f *fakeEnd) end(l uint32, msgID string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inflight[l]--
	f.total--
	if err == nil {
		f.applied = append(f.applied, msgID)
	}
}

func (f *fakeEnd) EndTransactionAsync(ctx context.Context, h client.TxHandle, commit bool, cb func(error)) {
	l, err, d := f.begin(ctx, h, commit, true)
	if f.syncAnswers {
		f.end(l, h.MsgID, err)
		cb(err)
		return
	}
	f.wg.Go(func() {
		if f.hold != nil {
			<-f.hold
		}
		time.Sleep(d) // a delayed answer (the fake's own goroutine)
		f.end(l, h.MsgID, err)
		cb(err)
	})
}

func (f *fakeEnd) EndTransaction(ctx context.Context, h client.TxHandle, commit bool) error {
	l, err, d := f.begin(ctx, h, commit, false)
	if d > 0 && backoff.Sleep(ctx, d) != nil {
		err = ctx.Err()
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	f.end(l, h.MsgID, err)
	return err
}

func (f *fakeEnd) snapshot() (calls []fakeCall, applied []string, maxTotal int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls), slices.Clone(f.applied), f.maxTotal
}

func (f *fakeEnd) inFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}

// laneHandles returns n handles over lanes lanes, unevenly (lane of
// handle i is drawn at random, seeded), some lanes with one handle.
func laneHandles(n, lanes int) []txnHandle {
	r := rand.New(rand.NewPCG(3, 4))
	hs := make([]txnHandle, n)
	for i := range hs {
		l := uint32(r.IntN(lanes))
		if i < lanes {
			l = uint32(i) // every lane is used
		}
		hs[i] = txnHandle{lane: l, h: client.TxHandle{MsgID: "h" + strconv.Itoa(i), TransactionID: "h" + strconv.Itoa(i)}}
	}
	return hs
}

func testCommitter(f endSender, attempts int) *laneCommitter {
	return &laneCommitter{end: f, attempts: attempts, retry: backoff.Policy{Initial: time.Millisecond, Max: 4 * time.Millisecond},
		log: slog.New(slog.DiscardHandler), group: "g"}
}

// checkLaneOrder fails unless applied holds every handle of hs exactly
// once and each lane's in write order.
func checkLaneOrder(t *testing.T, hs []txnHandle, applied []string) {
	t.Helper()
	idx := make(map[string]int, len(hs))
	for i, h := range hs {
		idx[h.h.MsgID] = i
	}
	last := make(map[uint32]int)
	seen := make(map[string]bool, len(hs))
	for _, id := range applied {
		i, ok := idx[id]
		if !ok {
			t.Fatalf("unknown half message %s ended", id)
		}
		if seen[id] {
			t.Fatalf("%s ended twice", id)
		}
		seen[id] = true
		l := hs[i].lane
		if p, ok := last[l]; ok && p > i {
			t.Fatalf("lane %d: handle %d ended after handle %d", l, i, p)
		}
		last[l] = i
	}
	if len(seen) != len(hs) {
		t.Fatalf("%d of %d half messages ended", len(seen), len(hs))
	}
}

// retryable is a broker refusal a retry can change.
var retryable = &protocol.Error{Code: protocol.ResSystemBusy, Remark: "busy"}

// TestExactlyOnceLanesOrder: every half message is ended once, each
// lane in write order with at most one request in flight, lanes in
// parallel: every lane's first request is in flight before any answer,
// and answers arriving in any order across lanes do not reorder a lane.
// With a send timeout every pipelined request has a deadline.
func TestExactlyOnceLanesOrder(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		t.Run("timeout="+timeout.String(), func(t *testing.T) {
			const lanes = 37
			hs := laneHandles(3000, lanes)
			f := newFakeEnd(t, hs)
			f.maxDelay = 200 * time.Microsecond
			f.hold = make(chan struct{})
			lc := testCommitter(f, 3)
			lc.timeout = timeout
			done := make(chan error, 1)
			go func() {
				discarded, err := lc.endAll(context.Background(), hs, true, nil)
				if len(discarded) > 0 {
					err = errors.Join(err, fmt.Errorf("discarded %v", discarded))
				}
				done <- err
			}()
			testutil.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
				if n := f.inFlight(); n != lanes {
					return fmt.Errorf("%d requests in flight, want one per lane (%d)", n, lanes)
				}
				return nil
			})
			close(f.hold)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			calls, applied, maxTotal := f.snapshot()
			checkLaneOrder(t, hs, applied)
			if len(calls) != len(hs) || maxTotal != lanes {
				t.Fatalf("%d requests for %d half messages, at most %d in flight (want %d)", len(calls), len(hs), maxTotal, lanes)
			}
			for _, c := range calls {
				if !c.async || !c.commit || c.deadline != (timeout > 0) {
					t.Fatalf("request %+v: want a pipelined commit, deadline %v", c, timeout > 0)
				}
			}
		})
	}
}

// TestExactlyOnceLanesRetry: END_TRANSACTIONs refused a few times (first,
// middle and last handle of lanes, the pipelined answer failing) are
// retried on the lane's own goroutine from the refused handle, in order;
// every half message ends once, no later handle of the lane before it.
func TestExactlyOnceLanesRetry(t *testing.T) {
	const lanes = 8
	hs := laneHandles(400, lanes)
	f := newFakeEnd(t, hs)
	f.maxDelay = 100 * time.Microsecond
	byLane := make(map[uint32][]int)
	for i, h := range hs {
		byLane[h.lane] = append(byLane[h.lane], i)
	}
	refused := map[string]int{
		hs[byLane[0][0]].h.MsgID:                  2,
		hs[byLane[1][len(byLane[1])/2]].h.MsgID:   3,
		hs[byLane[2][len(byLane[2])-1]].h.MsgID:   1,
		hs[byLane[3][len(byLane[3])/3]].h.MsgID:   4, // attempts-1: the last attempt succeeds
		hs[byLane[3][2*len(byLane[3])/3]].h.MsgID: 1, // a second refusal, in the handed-over part
	}
	for id, n := range refused {
		f.script[id] = slices.Repeat([]error{retryable}, n)
	}
	lc := testCommitter(f, 5)
	if _, err := lc.endAll(context.Background(), hs, true, nil); err != nil {
		t.Fatal(err)
	}
	calls, applied, _ := f.snapshot()
	checkLaneOrder(t, hs, applied)
	refusals := 0
	perID := make(map[string]int)
	for _, c := range calls {
		perID[c.msgID]++
	}
	for id, n := range refused {
		refusals += n
		if perID[id] != n+1 {
			t.Errorf("%s refused %d times: %d requests, want %d", id, n, perID[id], n+1)
		}
	}
	if len(calls) != len(hs)+refusals {
		t.Errorf("%d requests, want %d", len(calls), len(hs)+refusals)
	}
}

// TestExactlyOnceLanesHandOver: once a pipelined answer failed, every lane's
// next END_TRANSACTION goes to a goroutine of the lane's own (synchronous,
// in order) instead of the pipeline. The first lane's first request fails
// before EndTransactionAsync returns (a dead connection), so every other
// lane is handed over before its first request.
func TestExactlyOnceLanesHandOver(t *testing.T) {
	const lanes = 16
	hs := laneHandles(800, lanes)
	f := newFakeEnd(t, hs)
	f.syncAnswers = true
	f.script[hs[0].h.MsgID] = []error{fmt.Errorf("dial: %w", errors.New("connection refused"))}
	lc := testCommitter(f, 3)
	lc.timeout = time.Minute
	if _, err := lc.endAll(context.Background(), hs, true, nil); err != nil {
		t.Fatal(err)
	}
	calls, applied, _ := f.snapshot()
	checkLaneOrder(t, hs, applied)
	if len(calls) != len(hs)+1 {
		t.Fatalf("%d requests, want %d", len(calls), len(hs)+1)
	}
	if c := calls[0]; !c.async || c.msgID != hs[0].h.MsgID || c.err == nil {
		t.Fatalf("first request %+v: want the failed pipelined one", c)
	}
	for _, c := range calls[1:] {
		if c.async || !c.deadline {
			t.Fatalf("request %+v after the failure: want a synchronous one with a deadline", c)
		}
	}
}

// TestExactlyOnceLanesFailForGood: a handle refused every time fails endAll
// after the configured attempts with its error; its lane stops there (no
// later handle of it is ended), and the failure stops the other lanes: each
// request takes 2 ms, so the others, with a thousand handles each, are far
// from done when the failed lane gives up after a dozen requests.
func TestExactlyOnceLanesFailForGood(t *testing.T) {
	const lanes, per, attempts = 4, 1000, 3
	hs := laneHandles(lanes*per, lanes)
	f := newFakeEnd(t, hs)
	f.minDelay = 2 * time.Millisecond
	bad, seen := 0, 0 // the 10th handle of lane 1
	for ; ; bad++ {
		if hs[bad].lane == 1 {
			if seen++; seen == 10 {
				break
			}
		}
	}
	f.forever[hs[bad].h.MsgID] = retryable
	lc := testCommitter(f, attempts)
	_, err := lc.endAll(context.Background(), hs, true, nil)
	if !errors.Is(err, protocol.ErrSystemBusy) {
		t.Fatalf("endAll with a handle refused for good: %v", err)
	}
	calls, applied, _ := f.snapshot()
	n := 0
	for _, c := range calls {
		if c.msgID == hs[bad].h.MsgID {
			n++
		}
	}
	if n != attempts {
		t.Fatalf("refused handle tried %d times, want %d", n, attempts)
	}
	ended := make(map[string]bool, len(applied))
	for _, id := range applied {
		ended[id] = true
	}
	for i, h := range hs {
		if h.lane == 1 && ended[h.h.MsgID] != (i < bad) {
			t.Fatalf("handle %d of the failed lane (refused at %d): ended %v", i, bad, ended[h.h.MsgID])
		}
	}
	t.Logf("%d of %d half messages ended before the failure stopped the lanes", len(applied), len(hs))
	if len(applied) > len(hs)/2 {
		t.Fatalf("%d of %d half messages ended: the failure did not stop the other lanes", len(applied), len(hs))
	}
}

// TestExactlyOnceLanesNoRetry: refusals no retry can change end their lane
// at the first attempt: a commit of a rolled-back half message
// (ErrRolledBack), an abort of a committed one, a closed producer.
func TestExactlyOnceLanesNoRetry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit bool
		err    error
		want   error
	}{
		{"rolled back", true, &protocol.Error{Code: protocol.ResSystemError, Remark: "the transaction already ended with rollback, cannot commit"}, ErrRolledBack},
		{"committed", false, &protocol.Error{Code: protocol.ResSystemError, Remark: "the transaction already ended with commit, cannot rollback"}, protocol.ErrSystemError},
		{"closed", true, client.ErrClosed, client.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := laneHandles(50, 5)
			f := newFakeEnd(t, hs)
			f.forever[hs[7].h.MsgID] = tc.err
			_, err := testCommitter(f, 5).endAll(context.Background(), hs, tc.commit, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("endAll: %v, want %v", err, tc.want)
			}
			calls, _, _ := f.snapshot()
			n := 0
			for _, c := range calls {
				if c.msgID == hs[7].h.MsgID {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("refused handle tried %d times, want 1", n)
			}
		})
	}
}

// TestExactlyOnceLanesDiscarded: a commit that finds half messages discarded
// by the broker returns their indexes without again; with again it calls
// again for each, in its lane before the lane's next handle, and
// succeeds. A rollback of a discarded half message is the broker's
// success (the fake answers nil), not endAll's concern.
func TestExactlyOnceLanesDiscarded(t *testing.T) {
	discard := &protocol.Error{Code: protocol.ResSystemError, Remark: "the transaction already ended with discard, cannot commit"}
	hs := laneHandles(300, 6)
	gone := []int{0, 11, 12, 150, 299}
	t.Run("no copy", func(t *testing.T) {
		f := newFakeEnd(t, hs)
		for _, i := range gone {
			f.forever[hs[i].h.MsgID] = discard
		}
		discarded, err := testCommitter(f, 5).endAll(context.Background(), hs, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(discarded)
		if !slices.Equal(discarded, gone) {
			t.Fatalf("discarded %v, want %v", discarded, gone)
		}
		_, applied, _ := f.snapshot()
		if len(applied) != len(hs)-len(gone) {
			t.Fatalf("%d committed, want %d", len(applied), len(hs)-len(gone))
		}
	})
	t.Run("sent again", func(t *testing.T) {
		f := newFakeEnd(t, hs)
		for _, i := range gone {
			f.forever[hs[i].h.MsgID] = discard
		}
		again := func(_ context.Context, i int) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.applied = append(f.applied, hs[i].h.MsgID) // committed as a new half message, in its place
			return nil
		}
		discarded, err := testCommitter(f, 5).endAll(context.Background(), hs, true, again)
		if err != nil || len(discarded) != 0 {
			t.Fatalf("endAll: %v, discarded %v", err, discarded)
		}
		_, applied, _ := f.snapshot()
		checkLaneOrder(t, hs, applied)
	})
}

// TestExactlyOnceLanesStopped: when ctx ends during a commit, no lane sends
// its next END_TRANSACTION, and endAll returns ctx's error once the
// requests in flight are answered.
func TestExactlyOnceLanesStopped(t *testing.T) {
	const lanes = 10
	hs := laneHandles(500, lanes)
	f := newFakeEnd(t, hs)
	f.hold = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := testCommitter(f, 3).endAll(ctx, hs, true, nil)
		done <- err
	}()
	testutil.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
		if n := f.inFlight(); n != lanes {
			return fmt.Errorf("%d requests in flight, want %d", n, lanes)
		}
		return nil
	})
	cancel()
	close(f.hold)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("endAll after ctx ended: %v", err)
	}
	if calls, _, _ := f.snapshot(); len(calls) != lanes {
		t.Fatalf("%d requests, want only the %d in flight when ctx ended", len(calls), lanes)
	}
}
