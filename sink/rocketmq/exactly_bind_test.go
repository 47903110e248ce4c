package rocketmq

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/transport/broker"
)

// TestExactlyOnceBind: a sink without WithTxGroup has no producer group
// until Bind: every method fails with ErrNoTxGroup (Close succeeds). Bind
// derives TxGroup(job, UID); the bound sink commits end to end; a repeated
// Bind with the same identity is a no-op, one with another identity and
// one without a job name fail; WithTxGroup's group survives Bind.
func TestExactlyOnceBind(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t)
	cl.createTopic("eo_bind", 2)

	unbound, err := NewExactlyOnce(cl.c, keyedMapper("eo_bind"))
	if err != nil {
		t.Fatal(err)
	}
	if g := unbound.Group(); g != "" {
		t.Fatalf("group before Bind: %q", g)
	}
	for name, err := range map[string]error{
		"Recover":     unbound.Recover(ctx, nil),
		"Write":       unbound.Write(ctx, keyed{Key: "k", Seq: 0}),
		"Flush":       unbound.Flush(ctx),
		"Commit":      unbound.Commit(ctx, nil),
		"StartCommit": unbound.StartCommit(ctx, nil),
		"WaitCommits": unbound.WaitCommits(ctx),
		"Abort":       unbound.Abort(ctx, nil),
	} {
		if !errors.Is(err, ErrNoTxGroup) {
			t.Errorf("%s without a group: %v", name, err)
		}
	}
	if _, err := unbound.PreCommit(ctx, 1); !errors.Is(err, ErrNoTxGroup) {
		t.Errorf("PreCommit without a group: %v", err)
	}
	if err := unbound.Close(); err != nil {
		t.Fatalf("Close of a sink never bound: %v", err)
	}
	if err := unbound.Bind(jobinfo.Info{Job: "job", UID: "bind"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Bind after Close: %v", err)
	}

	s, err := NewExactlyOnce(cl.c, keyedMapper("eo_bind"), WithTxRetry(3, backoff.Policy{Initial: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(jobinfo.Info{UID: "bind"}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Bind without a job name: %v", err)
	}
	info := jobinfo.Info{Job: "my job", UID: "bind/1", StateDir: t.TempDir()}
	if err := s.Bind(info); err != nil {
		t.Fatal(err)
	}
	if g, want := s.Group(), TxGroup("my job", "bind/1"); g != want {
		t.Fatalf("bound group %q, want %q", g, want)
	}
	info.StateDir = "elsewhere" // the group does not depend on it
	if err := s.Bind(info); err != nil {
		t.Fatalf("repeated Bind: %v", err)
	}
	if err := s.Bind(jobinfo.Info{Job: "my job", UID: "other"}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Bind to another identity: %v", err)
	}
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := s.Write(ctx, keyed{Key: "k" + strconv.Itoa(i%2), Seq: i / 2}); err != nil {
			t.Fatal(err)
		}
	}
	txn, err := s.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	checkOnceInOrder(t, cl.readTopic("eo_bind"), 2, 5)
	d, err := decodeTxn(txn)
	if err != nil {
		t.Fatal(err)
	}
	if g := d.handles[0].h.ProducerGroup; g != s.Group() {
		t.Fatalf("half messages sent by group %q, want the bound %q", g, s.Group())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	explicit, err := NewExactlyOnce(cl.c, keyedMapper("eo_bind"), WithTxGroup("explicit_group"))
	if err != nil {
		t.Fatal(err)
	}
	defer explicit.Close()
	if err := explicit.Bind(jobinfo.Info{Job: "job", UID: "x"}); err != nil || explicit.Group() != "explicit_group" {
		t.Fatalf("Bind of a sink given WithTxGroup: %v, group %q", err, explicit.Group())
	}
}

// TestExactlyOnceBindKeepsGroup: a job whose sink was named with
// WithTxGroup(TxGroup(job, uid)) (as every job did before Bind) restarts
// with a bound sink: the bound run commits the checkpointed transaction,
// and, being in the same producer group, receives the broker's check-backs
// for the crashed run's half messages no checkpoint lists and rolls them
// back. (A bound sink in another group would never be asked: they would
// stay pending, and the wait below would time out.)
func TestExactlyOnceBindKeepsGroup(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, broker.WithTransactionTimeout(100*time.Millisecond), broker.WithTransactionCheckInterval(50*time.Millisecond),
		broker.WithTransactionCheckMax(1000))
	cl.createTopic("eo_keep", 2)
	old := newEO(t, cl, TxGroup("job", "keep"), "eo_keep")
	if err := old.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := old.Write(ctx, keyed{Key: "k", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	txn, err := old.PreCommit(ctx, 1) // checkpoint 1 lists these; the run dies before committing
	if err != nil {
		t.Fatal(err)
	}
	for i := 6; i < 10; i++ { // epoch 2: no checkpoint lists it
		if err := old.Write(ctx, keyed{Key: "k", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := NewExactlyOnce(cl.c, keyedMapper("eo_keep"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Bind(jobinfo.Info{Job: "job", UID: "keep", StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(ctx, [][]byte{txn}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the crashed run's unlisted half messages to be rolled back", 20*time.Second, func() bool {
		return cl.b.TransactionStats().RolledBack == 4
	})
	checkOnceInOrder(t, cl.readTopic("eo_keep"), 1, 6)
	if st := cl.b.TransactionStats(); st.Committed != 6 || st.RolledBack != 4 {
		t.Fatalf("broker: %+v, want 6 committed and 4 rolled back", st)
	}
}
