package rocketmq

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

type keyed struct {
	Key string
	Seq int
}

func keyedMapper(topic string) func(keyed) (*client.Message, error) {
	return func(r keyed) (*client.Message, error) {
		m := &client.Message{Topic: topic, Body: []byte(r.Key + ":" + strconv.Itoa(r.Seq)), ShardingKey: r.Key, Keys: []string{r.Key}}
		Lineage{Topic: "in", Broker: "b", Queue: 1, Offset: int64(r.Seq)}.SetOn(m)
		return m, nil
	}
}

func newEO(t *testing.T, cl *cluster, group, topic string, opts ...TxOption) *ExactlyOnce[keyed] {
	t.Helper()
	s, err := NewExactlyOnce(cl.c, keyedMapper(topic), append([]TxOption{WithTxGroup(group), WithTxRetry(3, backoff.Policy{Initial: time.Millisecond})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkOnceInOrder checks that msgs hold each (key, seq) with seq < per
// exactly once, in seq order per key.
func checkOnceInOrder(t *testing.T, msgs []protocol.MessageExt, keys, per int) {
	t.Helper()
	next := make(map[string]int)
	for _, m := range msgs {
		k, s, _ := strings.Cut(string(m.Body), ":")
		seq, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("body %q: %v", m.Body, err)
		}
		if seq != next[k] {
			t.Fatalf("key %s: got seq %d, want %d (duplicate, loss or reorder)", k, seq, next[k])
		}
		next[k]++
		if v, _ := m.Property(PropSrcOffset); v != strconv.Itoa(seq) {
			t.Fatalf("lineage offset %q for seq %d", v, seq)
		}
		if v, _ := m.Property(PropEpoch); v == "" {
			t.Fatal("no epoch property")
		}
	}
	if len(next) != keys {
		t.Fatalf("%d keys, want %d", len(next), keys)
	}
	for k, n := range next {
		if n != per {
			t.Fatalf("key %s: %d records, want %d", k, n, per)
		}
	}
}

// TestExactlyOnceVisibleOnlyAfterCommit: half messages are invisible until
// Commit; Commit is idempotent, also from a new process (run) that only
// got the description through Recover; per-key order is kept.
func TestExactlyOnceVisibleOnlyAfterCommit(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t)
	cl.createTopic("eo_out", 4)
	s := newEO(t, cl, TxGroup("job", "out"), "eo_out", WithCommitLanes(8))
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	const keys, per = 10, 30
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
	again, err := s.PreCommit(ctx, 1)
	if err != nil || string(again) != string(txn) {
		t.Fatalf("repeated PreCommit: %v", err)
	}
	if n := len(cl.readTopic("eo_out")); n != 0 {
		t.Fatalf("%d messages visible before Commit", n)
	}
	if st := cl.b.TransactionStats(); st.Prepared != keys*per {
		t.Fatalf("prepared %d, want %d", st.Prepared, keys*per)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil { // waits for the commit
		t.Fatal(err)
	}
	checkOnceInOrder(t, cl.readTopic("eo_out"), keys, per)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A new run commits the same description again: nothing changes.
	s2 := newEO(t, cl, TxGroup("job", "out"), "eo_out")
	if err := s2.Recover(ctx, [][]byte{txn}); err != nil {
		t.Fatal(err)
	}
	if err := s2.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkOnceInOrder(t, cl.readTopic("eo_out"), keys, per)
	if st := cl.b.TransactionStats(); st.Committed != keys*per {
		t.Fatalf("committed %d, want %d", st.Committed, keys*per)
	}
	if s2.e.epoch != 2 {
		t.Fatalf("next epoch after recovering checkpoint 1: %d", s2.e.epoch)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceCheckBack: half messages of a dead run that no checkpoint
// lists are rolled back by the next run's check-back answers; this run's
// open and pre-committed (not yet durable) epochs are left pending (unknown)
// across several check rounds, then committed.
func TestExactlyOnceCheckBack(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, broker.WithTransactionTimeout(100*time.Millisecond), broker.WithTransactionCheckInterval(50*time.Millisecond),
		broker.WithTransactionCheckMax(1000))
	cl.createTopic("eo_cb", 2)
	group := TxGroup("job", "cb")
	dead := newEO(t, cl, group, "eo_cb")
	if err := dead.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := dead.Write(ctx, keyed{Key: "k" + strconv.Itoa(i%3), Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := dead.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dead.Close(); err != nil { // the run dies before its checkpoint
		t.Fatal(err)
	}

	s := newEO(t, cl, group, "eo_cb")
	// Before Recover every answer is unknown.
	if got := s.e.decider.decide(ctx, halfQuery{run: "other", epoch: 1, msgID: "x"}); got != client.TxUnknown {
		t.Fatalf("answer before Recover: %v", got)
	}
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := s.Write(ctx, keyed{Key: "k0", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dead run's half messages to be rolled back", 20*time.Second, func() bool {
		return cl.b.TransactionStats().RolledBack == 20
	})
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	checks := cl.b.TransactionStats().CheckBacks
	waitFor(t, "check-backs of the pre-committed epoch", 20*time.Second, func() bool {
		return cl.b.TransactionStats().CheckBacks >= checks+10
	})
	if st := cl.b.TransactionStats(); st.RolledBack != 20 || st.Committed != 0 {
		t.Fatalf("pre-committed epoch was ended by a check-back: %+v", st)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkOnceInOrder(t, cl.readTopic("eo_cb"), 1, 5)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceDiscardWindow: an epoch kept open past three quarters of
// the discard window is rolled back and sent again; a pre-committed epoch whose half
// messages the broker discarded (the process paused past the window) is
// sent again from memory at Commit, exactly once; a new run without a copy
// fails with ErrDiscarded.
func TestExactlyOnceDiscardWindow(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, broker.WithTransactionTimeout(50*time.Millisecond), broker.WithTransactionCheckInterval(20*time.Millisecond),
		broker.WithTransactionCheckMax(1))
	cl.createTopic("eo_dw", 2)
	window := 50*time.Millisecond + 20*time.Millisecond
	s := newEO(t, cl, TxGroup("job", "dw"), "eo_dw", WithDiscardWindow(window))
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := s.Write(ctx, keyed{Key: "k0", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "discards", 20*time.Second, func() bool { return cl.b.TransactionStats().Discarded == 10 })
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkOnceInOrder(t, cl.readTopic("eo_dw"), 1, 10)

	// A new run has no copy: loud failure.
	s2 := newEO(t, cl, TxGroup("job", "dw"), "eo_dw", WithDiscardWindow(window))
	if err := s2.Recover(ctx, [][]byte{txn}); err != nil {
		t.Fatal(err)
	}
	if err := s2.Commit(ctx, txn); !errors.Is(err, ErrDiscarded) {
		t.Fatalf("commit of discarded halves without a copy: %v", err)
	}
	if err := s2.Write(ctx, keyed{Key: "k", Seq: 0}); !errors.Is(err, ErrDiscarded) {
		t.Fatalf("write after a failed commit: %v", err)
	}

	// An epoch open too long is rolled back and sent again.
	s3 := newEO(t, cl, TxGroup("job", "dw3"), "eo_dw", WithDiscardWindow(window))
	if err := s3.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := s3.Write(ctx, keyed{Key: "k1", Seq: 0}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window) // let the epoch age (the condition under test is elapsed time)
	if err := s3.Write(ctx, keyed{Key: "k1", Seq: 1}); err != nil {
		t.Fatal(err)
	}
	txn3, err := s3.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Commit(ctx, txn3); err != nil {
		t.Fatal(err)
	}
	if err := s3.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var k0, k1 []protocol.MessageExt
	for _, m := range cl.readTopic("eo_dw") {
		if strings.HasPrefix(string(m.Body), "k0:") {
			k0 = append(k0, m)
		} else {
			k1 = append(k1, m)
		}
	}
	checkOnceInOrder(t, k0, 1, 10)
	checkOnceInOrder(t, k1, 1, 2)
	if err := errors.Join(s.Close(), s3.Close()); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); !errors.Is(err, ErrDiscarded) {
		t.Fatalf("close after a failed commit: %v", err)
	}
}

func TestExactlyOnceOptionsValidated(t *testing.T) {
	cl := newCluster(t)
	m := keyedMapper("t")
	for _, tc := range []struct {
		name string
		opts []TxOption
	}{
		{"lanes", []TxOption{WithCommitLanes(0)}},
		{"inflight", []TxOption{WithTxMaxInFlight(0)}},
		{"attempts", []TxOption{WithTxRetry(0, backoff.Policy{})}},
		{"timeout", []TxOption{WithTxSendTimeout(0)}},
		{"window", []TxOption{WithDiscardWindow(-1)}},
		{"epoch", []TxOption{WithMaxEpochRecords(0)}},
	} {
		if _, err := NewExactlyOnce(cl.c, m, append([]TxOption{WithTxGroup("g")}, tc.opts...)...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := NewExactlyOnce[keyed](cl.c, nil, WithTxGroup("g")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil mapper: %v", err)
	}
	if _, err := NewExactlyOnce(cl.c, m, WithTxGroup("")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("empty group: %v", err)
	}
	if g := TxGroup("my job", "out/1"); g != "runnel_tx_my_job_out_1" {
		t.Errorf("TxGroup: %q", g)
	}
}

func TestTxnCodecRoundTrip(t *testing.T) {
	d := &txnDesc{checkpoint: 7, run: "abc", epoch: 7}
	for i := range 100 {
		d.handles = append(d.handles, txnHandle{lane: uint32(i % 5), h: client.TxHandle{
			ProducerGroup: "g", Topic: "t" + strconv.Itoa(i%2), BrokerName: "b", BrokerAddr: "127.0.0.1:1",
			TranStateTableOffset: int64(i), CommitLogOffset: int64(i * 1000), MsgID: "id" + strconv.Itoa(i), TransactionID: "id" + strconv.Itoa(i),
		}})
	}
	d.handles[3].h.TransactionID = "other"
	b := appendTxn(nil, d)
	got, err := decodeTxn(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.checkpoint != 7 || got.run != "abc" || got.epoch != 7 || len(got.handles) != 100 {
		t.Fatalf("header: %+v", got)
	}
	for i := range d.handles {
		if got.handles[i] != d.handles[i] {
			t.Fatalf("handle %d: %+v != %+v", i, got.handles[i], d.handles[i])
		}
	}
	for n := range len(b) {
		if _, err := decodeTxn(b[:n]); !errors.Is(err, ErrBadTxn) {
			t.Fatalf("truncated at %d: %v", n, err)
		}
	}
}

// FuzzDecodeTxn: decodeTxn never panics, and what it decodes re-encodes to
// a description that decodes to the same value.
func FuzzDecodeTxn(f *testing.F) {
	f.Add(appendTxn(nil, &txnDesc{checkpoint: 1, run: "r", epoch: 1, handles: []txnHandle{{lane: 1, h: client.TxHandle{MsgID: "m", TransactionID: "m"}}}}))
	f.Add([]byte("RX\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeTxn(b)
		// Skimming (txnInfo) accepts exactly what decoding accepts and
		// counts the same handles and retried slots.
		sd, n, serr := decodeTxnAs(b, false)
		if (err == nil) != (serr == nil) {
			t.Fatalf("decode: %v; skim: %v", err, serr)
		}
		if err != nil {
			return
		}
		if n != len(d.handles) || sd.handles != nil || !slices.Equal(sd.retried, d.retried) || sd.run != d.run || sd.epoch != d.epoch {
			t.Fatalf("skim: %d handles, retried %v; decode: %d, %v", n, sd.retried, len(d.handles), d.retried)
		}
		d2, err := decodeTxn(appendTxn(nil, d))
		if err != nil || len(d2.handles) != len(d.handles) || d2.run != d.run {
			t.Fatalf("re-encoding: %v", err)
		}
	})
}

// TestExactlyOnceRetriesHalfSends: half sends that fail (no such topic yet)
// are tried again with backoff, and the epoch commits every record once
// the topic exists; sends that fail for good fail PreCommit.
func TestExactlyOnceRetriesHalfSends(t *testing.T) {
	cl := newCluster(t, broker.WithAutoCreateTopics(false))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newEO(t, cl, TxGroup("job", "retry"), "eo_later", WithTxRetry(40, backoff.Policy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}))
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		if err := s.Write(ctx, keyed{Key: "k" + strconv.Itoa(i%3), Seq: i / 3}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // every first attempt has failed
	cl.createTopic("eo_later", 2)
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	if got := cl.readTopic("eo_later"); len(got) != n {
		t.Fatalf("%d records visible, want %d", len(got), n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	never := newEO(t, cl, TxGroup("job", "never"), "eo_never", WithTxRetry(3, backoff.Policy{Initial: time.Millisecond}))
	defer never.Close()
	if err := never.Write(ctx, keyed{Key: "k", Seq: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := never.PreCommit(ctx, 1); err == nil || !strings.Contains(err.Error(), "failed after 3 attempts") {
		t.Fatalf("PreCommit with a half send failing for good: %v", err)
	}
}
