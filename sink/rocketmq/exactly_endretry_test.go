package rocketmq

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Tests of the failure path of ExactlyOnce.endAll: an END_TRANSACTION of
// the pipeline fails, its lane is handed over to endLane (retries with
// backoff from the failed handle) while the other lanes go on. Faults are
// injected at the real broker: an interceptor of its remoting server that
// refuses or swallows chosen END_TRANSACTION requests, and a broker closed
// and started again on the same address and data directory. The sink
// exposes no count or log of its END_TRANSACTION retries: the interceptor
// is what shows that the failure path ran (a handle refused, then asked
// again; requests cut off, then sent to the restarted broker).

// endCall is one END_TRANSACTION request (not an answer to a check-back)
// the broker received.
type endCall struct {
	msgID   string
	refused bool // answered SYSTEM_BUSY by the tap
	held    bool // swallowed: never answered (until the connection closes)
}

// endTap is a broker interceptor that records END_TRANSACTION requests,
// refuses those of chosen half messages a number of times, and, once
// holdAfter requests went through, swallows every later one.
type endTap struct {
	mu        sync.Mutex
	calls     []endCall
	refuse    map[string]int // msgID -> refusals left; negative: forever
	holdAfter int            // > 0: swallow every request after holdAfter passed
	passed    int
	held      chan struct{} // closed at the first swallowed request
	heldOnce  sync.Once
}

func newEndTap() *endTap {
	return &endTap{refuse: make(map[string]int), held: make(chan struct{})}
}

// remarkInjected starts the remark of a refused request.
const remarkInjected = "injected END_TRANSACTION failure"

func (e *endTap) intercept(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, bool) {
	req := rc.Request()
	if req.Code != protocol.ReqEndTransaction {
		return nil, false
	}
	if v, _ := req.Ext("fromTransactionCheck"); v == "true" {
		return nil, false
	}
	id, _ := req.Ext("msgId")
	e.mu.Lock()
	defer e.mu.Unlock()
	c := endCall{msgID: id}
	switch {
	case e.holdAfter > 0 && e.passed >= e.holdAfter:
		c.held = true
	case e.refuse[id] != 0:
		c.refused = true
		if e.refuse[id] > 0 {
			e.refuse[id]--
		}
	default:
		e.passed++
	}
	e.calls = append(e.calls, c)
	switch {
	case c.held:
		e.heldOnce.Do(func() { close(e.held) })
		return nil, true // no answer: the request fails when its connection closes
	case c.refused:
		return protocol.NewResponse(req, protocol.ResSystemBusy, remarkInjected+" for "+id), true
	}
	return nil, false
}

func (e *endTap) snapshot() []endCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]endCall(nil), e.calls...)
}

// restartCluster is a name server and a broker that can be closed and
// started again on the same address and data directory.
type restartCluster struct {
	t    *testing.T
	ns   *namesrv.Server
	dir  string
	addr string
	b    *broker.Broker // the current broker; the test goroutine only
	c    *client.Client
}

// newRestartCluster starts a name server and a broker with bopts (after
// the defaults), waits until the name server lists the broker, and returns
// the cluster with a client that heartbeats every 100 ms (so that a
// restarted broker soon knows the sink's producer for check-backs).
func newRestartCluster(t *testing.T, bopts ...broker.Option) *restartCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns := testutil.StartNameServer(ctx, t)
	rc := &restartCluster{t: t, ns: ns, dir: t.TempDir()}
	rc.start("127.0.0.1:0", bopts...)
	rc.addr = rc.b.Addr()
	t.Cleanup(func() { _ = rc.b.Close() })
	c, err := client.New(client.WithNameServers(ns.Addr()), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
		client.WithHeartbeatInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rc.c = c
	want := rc.b.AdvertisedAddr()
	testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		ci, err := c.ClusterInfo(ctx)
		if err != nil {
			return err
		}
		for _, bd := range ci.BrokerAddrTable {
			if bd.BrokerAddrs[0] == want {
				return nil
			}
		}
		return fmt.Errorf("name server does not list broker %s yet", want)
	})
	return rc
}

// start starts a broker on addr and the cluster's data directory.
func (rc *restartCluster) start(addr string, bopts ...broker.Option) {
	rc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := broker.New(append([]broker.Option{broker.WithDataDir(rc.dir), broker.WithListenAddr(addr),
		broker.WithBrokerName(testutil.BrokerName), broker.WithNameServers(rc.ns.Addr()), broker.WithFlushMode(broker.FlushAsync)}, bopts...)...)
	if err != nil {
		rc.t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		rc.t.Fatal(err)
	}
	rc.b = b
}

// kill closes the broker at once (connections cut, requests in flight
// abandoned) and returns its transaction counters.
func (rc *restartCluster) kill() broker.TransactionStats {
	rc.t.Helper()
	if err := rc.b.Close(); err != nil {
		rc.t.Fatal(err)
	}
	return rc.b.TransactionStats()
}

// restart starts a new broker on the old one's address and data directory.
func (rc *restartCluster) restart(bopts ...broker.Option) { rc.start(rc.addr, bopts...) }

func (rc *restartCluster) cl() *cluster { return &cluster{t: rc.t, b: rc.b, c: rc.c} }

func tapOption(tap *endTap) broker.Option {
	return broker.WithRemotingOptions(remoting.WithInterceptor(tap.intercept))
}

// endRetryKeys × endRetryPer records, over enough keys that many commit
// lanes are used.
const endRetryKeys, endRetryPer = 40, 50

// writeEpoch writes keys × per records (seq-major, so lanes interleave) and
// pre-commits them as checkpoint 1.
func writeEpoch(t *testing.T, s *ExactlyOnce[keyed], keys, per int) ([]byte, *txnDesc) {
	t.Helper()
	ctx := context.Background()
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for seq := range per {
		for k := range keys {
			if err := s.Write(ctx, keyed{Key: "k" + strconv.Itoa(k), Seq: seq}); err != nil {
				t.Fatal(err)
			}
		}
	}
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	d, err := decodeTxn(txn)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.handles) != keys*per {
		t.Fatalf("%d handles, want %d", len(d.handles), keys*per)
	}
	return txn, d
}

// lanesOf returns the handle indexes of each lane, in write order.
func lanesOf(d *txnDesc) map[uint32][]int {
	m := make(map[uint32][]int)
	for i, h := range d.handles {
		m[h.lane] = append(m[h.lane], i)
	}
	return m
}

// checkExactlyOnce returns an error unless msgs hold each (key, seq) with
// seq < per for keys keys exactly once, in seq order per key.
func checkExactlyOnce(msgs []protocol.MessageExt, keys, per int) error {
	next := make(map[string]int)
	for _, m := range msgs {
		k, s, _ := strings.Cut(string(m.Body), ":")
		seq, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("body %q: %w", m.Body, err)
		}
		if seq != next[k] {
			return fmt.Errorf("key %s: got seq %d, want %d (duplicate, loss or reorder)", k, seq, next[k])
		}
		next[k]++
	}
	if len(next) != keys {
		return fmt.Errorf("%d keys, want %d", len(next), keys)
	}
	for k, n := range next {
		if n != per {
			return fmt.Errorf("key %s: %d records, want %d", k, n, per)
		}
	}
	if len(msgs) != keys*per {
		return fmt.Errorf("%d records, want %d", len(msgs), keys*per)
	}
	return nil
}

// TestExactlyOnceEndRetryLaneRefused: END_TRANSACTIONs of a few half
// messages are refused (SYSTEM_BUSY) a few times: the first, a middle and
// the last handle of three lanes. Commit succeeds; every record is visible
// once, in order per key; each refused handle was retried, and ended
// before any later handle of its lane; the other lanes went on meanwhile.
func TestExactlyOnceEndRetryLaneRefused(t *testing.T) {
	tap := newEndTap()
	rc := newRestartCluster(t, tapOption(tap))
	cl := rc.cl()
	cl.createTopic("eo_refused", 4)
	// The backoff (100 ms, then 200 ms) leaves the other lanes time to
	// finish while the refused ones wait.
	logs := &retryLog{}
	s, err := NewExactlyOnce(rc.c, keyedMapper("eo_refused"),
		WithTxGroup(TxGroup("job", "refused")),
		WithTxRetry(5, backoff.Policy{Initial: 100 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: -1}),
		WithTxLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	txn, d := writeEpoch(t, s, endRetryKeys, endRetryPer)
	lanes := lanesOf(d)
	if len(lanes) < 10 {
		t.Fatalf("only %d lanes used", len(lanes))
	}
	// Three lanes: refuse their first, middle and last handles.
	type target struct {
		lane uint32
		pos  int // position in the lane
	}
	var targets []target
	for l, idx := range lanes {
		if len(idx) < 3 {
			continue
		}
		switch len(targets) {
		case 0:
			targets = append(targets, target{l, 0})
		case 1:
			targets = append(targets, target{l, len(idx) / 2})
		case 2:
			targets = append(targets, target{l, len(idx) - 1})
		}
	}
	if len(targets) != 3 {
		t.Fatal("not enough lanes with 3 handles")
	}
	const refusals = 2
	refused := make(map[string]target)
	tap.mu.Lock()
	for _, tg := range targets {
		id := d.handles[lanes[tg.lane][tg.pos]].h.MsgID
		tap.refuse[id] = refusals
		refused[id] = tg
	}
	tap.mu.Unlock()

	if err := s.Commit(context.Background(), txn); err != nil {
		t.Fatalf("Commit after transient END_TRANSACTION failures: %v", err)
	}
	if err := checkExactlyOnce(cl.readTopic("eo_refused"), endRetryKeys, endRetryPer); err != nil {
		t.Fatal(err)
	}
	if st := rc.b.TransactionStats(); st.Committed != endRetryKeys*endRetryPer || st.RolledBack != 0 {
		t.Fatalf("broker: %+v, want %d committed", st, endRetryKeys*endRetryPer)
	}

	// Every refused attempt that was retried was logged, with its msgId.
	for id := range refused {
		if got := logs.count(id); got != refusals {
			t.Errorf("%s: %d retry warnings logged, want %d", id, got, refusals)
		}
	}

	calls := tap.snapshot()
	laneOfID := make(map[string]uint32, len(d.handles))
	posOfID := make(map[string]int, len(d.handles))
	for l, idx := range lanes {
		for p, i := range idx {
			laneOfID[d.handles[i].h.MsgID] = l
			posOfID[d.handles[i].h.MsgID] = p
		}
	}
	// Per lane, the accepted ENDs come in write order, each handle once.
	acceptedPos := make(map[uint32]int)
	for _, c := range calls {
		if c.refused {
			continue
		}
		l := laneOfID[c.msgID]
		if p := posOfID[c.msgID]; p != acceptedPos[l] {
			t.Fatalf("lane %d: handle %d ended when handle %d was next", l, p, acceptedPos[l])
		}
		acceptedPos[l]++
	}
	for l, idx := range lanes {
		if acceptedPos[l] != len(idx) {
			t.Fatalf("lane %d: %d handles ended, want %d", l, acceptedPos[l], len(idx))
		}
	}
	// Each refused handle was refused `refusals` times and then accepted;
	// while it waited, other lanes' ENDs were served (the lanes went on).
	for id, tg := range refused {
		first, last, n := -1, -1, 0
		for i, c := range calls {
			if c.msgID != id {
				continue
			}
			if c.refused {
				n++
				if first < 0 {
					first = i
				}
			} else {
				last = i
			}
		}
		if n != refusals || last < first {
			t.Fatalf("handle %s (lane %d, position %d): %d refusals, accepted at %d after the first at %d", id, tg.lane, tg.pos, n, last, first)
		}
		others := 0
		progressed := make(map[uint32]bool)
		for _, c := range calls[first:last] {
			if l := laneOfID[c.msgID]; l != tg.lane && !c.refused {
				others++
				progressed[l] = true
			}
		}
		t.Logf("lane %d position %d/%d: refused %d times; %d ENDs of %d other lanes served meanwhile", tg.lane, tg.pos, len(lanes[tg.lane]), n, others, len(progressed))
		// A lane refused at its first handle waits 300 ms of backoff from
		// the start of the commit: every other lane (50 or more handles)
		// must have gone on meanwhile. (Refused later, the other lanes may
		// be finished already.)
		if tg.pos == 0 && len(progressed) != len(lanes)-1 {
			t.Fatalf("lane %d retried its first handle while only %d of the %d other lanes went on", tg.lane, len(progressed), len(lanes)-1)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceEndRetryBrokerRestart: the broker dies during Commit after
// serving some of the END_TRANSACTIONs (the rest are in flight, one per
// lane) and comes back on the same address and data directory 200 ms
// later. Commit succeeds; every record is visible once, in order per key;
// the half messages were ended partly by each broker; no half message of
// the sink is left pending (a probe half message left pending on purpose
// is the only one the sink's check-back answers roll back).
func TestExactlyOnceEndRetryBrokerRestart(t *testing.T) {
	tap := newEndTap()
	const before = 500 // END_TRANSACTIONs the first broker serves
	tap.holdAfter = before
	rc := newRestartCluster(t, tapOption(tap))
	cl := rc.cl()
	cl.createTopic("eo_restart", 4)
	// About 7 s of retries (the broker needs well under 1 s to come back);
	// a send timeout exercises the pipeline's per-lane request deadlines.
	s, err := NewExactlyOnce(rc.c, keyedMapper("eo_restart"),
		WithTxGroup(TxGroup("job", "restart")),
		WithTxRetry(40, backoff.Policy{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}),
		WithTxSendTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const n = endRetryKeys * endRetryPer
	ctx := context.Background()
	_, old := commitUntilCutOff(t, s, tap, rc)
	time.Sleep(200 * time.Millisecond)
	tap2 := newEndTap()
	rc.restart(tapOption(tap2), broker.WithTransactionTimeout(200*time.Millisecond),
		broker.WithTransactionCheckInterval(50*time.Millisecond), broker.WithTransactionCheckMax(1000))
	if err := s.WaitCommits(ctx); err != nil {
		t.Fatalf("Commit across a broker restart: %v", err)
	}
	cl = rc.cl()
	if err := checkExactlyOnce(cl.readTopic("eo_restart"), endRetryKeys, endRetryPer); err != nil {
		t.Fatal(err)
	}
	// The failure path ran: the first broker ended only part of the half
	// messages before it died with requests in flight (which failed), and
	// the new one was asked to end the rest.
	held := 0
	for _, c := range tap.snapshot() {
		if c.held {
			held++
		}
	}
	calls2 := tap2.snapshot()
	again := len(calls2)
	distinct := make(map[string]bool, again)
	for _, c := range calls2 {
		distinct[c.msgID] = true
	}
	t.Logf("first broker: %d committed, %d END_TRANSACTIONs cut off; second broker: %d END_TRANSACTIONs (%d half messages), %d committed",
		old.Committed, held, again, len(distinct), rc.b.TransactionStats().Committed)
	if old.Committed > before || old.Committed == 0 || held == 0 {
		t.Fatalf("first broker committed %d (cut-off %d), %d requests cut off", old.Committed, before, held)
	}
	if int64(again) < n-old.Committed {
		t.Fatalf("second broker got %d END_TRANSACTIONs, want at least %d", again, n-old.Committed)
	}
	// Repeats are not counted: the second broker committed those the first
	// did not (the first one's counter may miss a commit stored just as it
	// was closed), and rolled back or discarded none.
	if st := rc.b.TransactionStats(); st.Committed+old.Committed > n || st.Committed < n-before || st.RolledBack != 0 || st.Discarded != 0 {
		t.Fatalf("second broker %+v after the first committed %d (cut-off %d): want %d in all", st, old.Committed, before, n)
	}

	// No half message of the sink is pending: a probe half message of the
	// committed epoch, left pending on purpose, is checked back and rolled
	// back by the sink (as a pending one of the committed epoch would be);
	// the broker checks half messages in store order, so one left pending
	// by the commit would have been checked by then, and rolled back too.
	probe := &client.Message{Topic: "eo_restart", Body: []byte("probe:0"), ShardingKey: "probe",
		Properties: map[string]string{PropRun: s.Run(), PropEpoch: "1"}}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.e.p.SendHalf(pctx, probe); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the probe half message to be rolled back", 20*time.Second, func() bool {
		return rc.b.TransactionStats().RolledBack >= 1
	})
	time.Sleep(500 * time.Millisecond) // 10 more check rounds
	if st := rc.b.TransactionStats(); st.RolledBack != 1 || st.Committed+old.Committed > n {
		t.Fatalf("half messages still pending after the commit: %+v", st)
	}
	if err := checkExactlyOnce(cl.readTopic("eo_restart"), endRetryKeys, endRetryPer); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceEndRetryBrokerGone: the broker dies during Commit and does
// not come back: Commit fails within the retry budget, naming the commit
// and the broker; the sink stays failed. Once the broker is back, a new
// run recovers the checkpointed transaction and commits every record
// exactly once (those the first broker committed are not repeated). With
// WithTxSendTimeout every request, the pipelined ones included, has a
// deadline.
func TestExactlyOnceEndRetryBrokerGone(t *testing.T) {
	brokerGone(t, time.Second, WithTxSendTimeout(time.Second))
}

// TestExactlyOnceEndRetryBrokerGoneNoSendTimeout is
// TestExactlyOnceEndRetryBrokerGone in the default configuration (no
// WithTxSendTimeout).
func TestExactlyOnceEndRetryBrokerGoneNoSendTimeout(t *testing.T) {
	brokerGone(t, 0)
}

// brokerGone runs TestExactlyOnceEndRetryBrokerGone with the sink's opts;
// sendTimeout is the one they set (0: none).
func brokerGone(t *testing.T, sendTimeout time.Duration, opts ...TxOption) {
	tap := newEndTap()
	const before = 700
	tap.holdAfter = before
	rc := newRestartCluster(t, tapOption(tap))
	cl := rc.cl()
	cl.createTopic("eo_gone", 4)
	group := TxGroup("job", "gone")
	const attempts = 4
	retry := backoff.Policy{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	s, err := NewExactlyOnce(rc.c, keyedMapper("eo_gone"), append([]TxOption{WithTxGroup(group), WithTxRetry(attempts, retry)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	const n = endRetryKeys * endRetryPer
	ctx := context.Background()
	txn, old := commitUntilCutOff(t, s, tap, rc)
	start := time.Now()
	err = s.WaitCommits(ctx)
	took := time.Since(start)
	t.Logf("Commit failed after %v: %v", took, err)
	if err == nil {
		t.Fatal("Commit succeeded with the broker gone")
	}
	// Retry budget: attempts of at most the send timeout (or the client's
	// dial backoff, at most 2 s) with backoff (20+40+80 ms), plus, for the
	// pipelined requests cut off or sent after the broker died, one send
	// timeout each (a few).
	budget := time.Duration(attempts)*max(sendTimeout, 2*time.Second) + 5*max(sendTimeout, 2*time.Second)
	if took > budget {
		t.Fatalf("Commit took %v to fail (budget %v)", took, budget)
	}
	if msg := err.Error(); !strings.Contains(msg, "commit of checkpoint 1") || !strings.Contains(msg, rc.addr) {
		t.Fatalf("error does not name the commit and the broker: %v", err)
	}
	if err2 := s.Write(ctx, keyed{Key: "k0", Seq: endRetryPer}); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("Write after the failed commit: %v", err2)
	}
	if err2 := s.Close(); err2 == nil || !strings.Contains(err2.Error(), "commit of checkpoint 1") {
		t.Fatalf("Close after the failed commit: %v", err2)
	}
	if old.Committed == 0 || old.Committed > before {
		t.Fatalf("first broker committed %d (cut-off %d)", old.Committed, before)
	}

	// The broker comes back; the job restarts from checkpoint 1. What the
	// first broker committed is visible (its counter may miss a commit
	// stored just as it was closed).
	rc.restart()
	cl = rc.cl()
	visible := int64(len(cl.readTopic("eo_gone")))
	if visible < old.Committed || visible > before {
		t.Fatalf("%d records visible before recovery; the first broker counted %d commits (cut-off %d)", visible, old.Committed, before)
	}
	s2 := recoverCommit(t, rc, group, "eo_gone", txn)
	if err := checkExactlyOnce(cl.readTopic("eo_gone"), endRetryKeys, endRetryPer); err != nil {
		t.Fatal(err)
	}
	if st := rc.b.TransactionStats(); st.Committed != n-visible || st.RolledBack != 0 {
		t.Fatalf("second broker %+v after the first committed %d: want %d in all", st, visible, n)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceEndRetryBrokerDownAtCommit: the broker dies after the
// epoch is pre-committed and before its commit starts. Every lane's first
// END_TRANSACTION then waits for the broker's connection; sent one after
// another from the commit's pipeline, each would wait for a dial window of
// its own (up to 2 s, 40 lanes). The commit must fail within the retry
// budget of one lane, and a restarted job commits the epoch exactly once.
func TestExactlyOnceEndRetryBrokerDownAtCommit(t *testing.T) {
	rc := newRestartCluster(t)
	cl := rc.cl()
	cl.createTopic("eo_down", 4)
	group := TxGroup("job", "down")
	const attempts = 4
	s, err := NewExactlyOnce(rc.c, keyedMapper("eo_down"),
		WithTxGroup(group),
		WithTxRetry(attempts, backoff.Policy{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	txn, _ := writeEpoch(t, s, endRetryKeys, endRetryPer)
	rc.kill()
	ctx := context.Background()
	start := time.Now()
	err = s.Commit(ctx, txn)
	took := time.Since(start)
	t.Logf("Commit failed after %v: %v", took, err)
	if err == nil || !strings.Contains(err.Error(), "commit of checkpoint 1") {
		t.Fatalf("Commit with the broker down: %v", err)
	}
	// One lane's attempts, each at most a dial window (2 s) and a refused
	// dial, with slack for a loaded machine.
	if budget := time.Duration(attempts)*2*time.Second + 5*time.Second; took > budget {
		t.Fatalf("Commit took %v to fail (budget %v)", took, budget)
	}
	_ = s.Close() // fails: the commit failed
	rc.restart()
	cl = rc.cl()
	s2 := recoverCommit(t, rc, group, "eo_down", txn)
	if err := checkExactlyOnce(cl.readTopic("eo_down"), endRetryKeys, endRetryPer); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceEndRetryRefusedForGood: one half message's END_TRANSACTION
// is refused every time: Commit fails naming the refusal after the
// configured attempts, the other lanes are committed; a new run commits
// the rest exactly once once the broker accepts it.
func TestExactlyOnceEndRetryRefusedForGood(t *testing.T) {
	tap := newEndTap()
	rc := newRestartCluster(t, tapOption(tap))
	cl := rc.cl()
	cl.createTopic("eo_forgood", 4)
	group := TxGroup("job", "forgood")
	const attempts = 3
	s, err := NewExactlyOnce(rc.c, keyedMapper("eo_forgood"),
		WithTxGroup(group),
		WithTxRetry(attempts, backoff.Policy{Initial: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	const keys, per = 10, 20
	txn, d := writeEpoch(t, s, keys, per)
	bad := d.handles[3*keys+2].h.MsgID // key k2, seq 3
	tap.mu.Lock()
	tap.refuse[bad] = -1
	tap.mu.Unlock()
	ctx := context.Background()
	err = s.Commit(ctx, txn)
	if err == nil || !strings.Contains(err.Error(), remarkInjected) || !strings.Contains(err.Error(), "commit of checkpoint 1") {
		t.Fatalf("Commit with an END_TRANSACTION refused for good: %v", err)
	}
	n := 0
	for _, c := range tap.snapshot() {
		if c.msgID == bad {
			n++
		}
	}
	if n != attempts {
		t.Fatalf("refused handle tried %d times, want %d", n, attempts)
	}
	// Key k2's lane stopped at the refused handle (seq 3); the failure
	// stops the other lanes too (perhaps before they finished), but what
	// is visible of every key is a prefix of it, in order.
	visible := make(map[string]int)
	for _, m := range cl.readTopic("eo_forgood") {
		k, sq, _ := strings.Cut(string(m.Body), ":")
		if seq, _ := strconv.Atoi(sq); seq != visible[k] {
			t.Fatalf("key %s: seq %d visible after %d records", k, seq, visible[k])
		}
		visible[k]++
	}
	if visible["k2"] != 3 {
		t.Fatalf("%d records of key k2 visible, want the 3 before the refused one", visible["k2"])
	}
	t.Logf("visible before recovery: %v", visible)
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), remarkInjected) {
		t.Fatalf("Close after the failed commit: %v", err)
	}

	tap.mu.Lock()
	tap.refuse[bad] = 0
	tap.mu.Unlock()
	s2 := recoverCommit(t, rc, group, "eo_forgood", txn)
	if err := checkExactlyOnce(cl.readTopic("eo_forgood"), keys, per); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckExactlyOnceDetects: the check used above fails on a lost, a
// duplicated and a reordered record, and on a missing key.
func TestCheckExactlyOnceDetects(t *testing.T) {
	var ok []protocol.MessageExt
	for seq := range 3 {
		for k := range 2 {
			ok = append(ok, protocol.MessageExt{Body: []byte("k" + strconv.Itoa(k) + ":" + strconv.Itoa(seq))})
		}
	}
	if err := checkExactlyOnce(ok, 2, 3); err != nil {
		t.Fatal(err)
	}
	lost := append(append([]protocol.MessageExt(nil), ok[:2]...), ok[3:]...)
	lastLost := ok[:len(ok)-1]
	dup := append(append([]protocol.MessageExt(nil), ok...), ok[len(ok)-1])
	swapped := append([]protocol.MessageExt(nil), ok...)
	swapped[0], swapped[2] = swapped[2], swapped[0]
	for name, msgs := range map[string][]protocol.MessageExt{"lost": lost, "last lost": lastLost, "duplicate": dup, "reordered": swapped, "key missing": ok[:0]} {
		if err := checkExactlyOnce(msgs, 2, 3); err == nil {
			t.Errorf("%s: not detected", name)
		}
	}
}

// retryLog is a slog.Handler counting the sink's END_TRANSACTION retry
// warnings per msgId.
type retryLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *retryLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *retryLog) WithGroup(string) slog.Handler            { return l }

func (l *retryLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelWarn || !strings.Contains(r.Message, "END_TRANSACTION failed") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "msgId" {
			l.mu.Lock()
			if l.n == nil {
				l.n = map[string]int{}
			}
			l.n[a.Value.String()]++
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *retryLog) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[id]
}

// commitUntilCutOff writes an epoch of endRetryKeys × endRetryPer records,
// starts its commit, waits until tap holds the broker's answers (its
// cut-off) and kills the broker; it returns the epoch's transaction and
// the killed broker's stats.
func commitUntilCutOff(t *testing.T, s *ExactlyOnce[keyed], tap *endTap, rc *restartCluster) ([]byte, broker.TransactionStats) {
	t.Helper()
	txn, _ := writeEpoch(t, s, endRetryKeys, endRetryPer)
	if err := s.StartCommit(context.Background(), txn); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tap.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the commit never reached the broker's cut-off")
	}
	return txn, rc.kill()
}

// recoverCommit starts a new sink of group writing topic, as a restarted
// job would, recovers it from the checkpointed txn and commits txn.
func recoverCommit(t *testing.T, rc *restartCluster, group, topic string, txn []byte) *ExactlyOnce[keyed] {
	t.Helper()
	ctx := context.Background()
	s, err := NewExactlyOnce(rc.c, keyedMapper(topic), WithTxGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(ctx, [][]byte{txn}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatalf("recovery commit: %v", err)
	}
	return s
}
