package rocketmq

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// followerChains is a scaleout.Follower as jobinfo.Chains (what
// pipeline.RunWorker binds sinks with).
type followerChains struct{ f *scaleout.Follower }

func (c followerChains) Decide(task string, owner, epoch uint64) (jobinfo.Verdict, error) {
	v, err := c.f.Decide(task, owner, epoch)
	switch v {
	case scaleout.Valid:
		return jobinfo.Valid, err
	case scaleout.Invalid:
		return jobinfo.Invalid, err
	}
	return jobinfo.Undecided, err
}

func (c followerChains) SinkInfo(task, sink string, epoch uint64) ([]byte, bool) {
	return c.f.SinkInfo(task, sink, epoch)
}

// scaleWorker is one worker's side of a scale-out task: its client,
// follower, claim (writer) and store.
type scaleWorker struct {
	c     *client.Client
	f     *scaleout.Follower
	w     *scaleout.Writer
	store *checkpoint.Store
}

func newScaleWorker(t *testing.T, tc *testutil.Cluster, name string, log scaleout.TaskLog, group string) *scaleWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Heartbeats announce a new producer to the broker: often, so that the
	// check-backs reach a sink created during the test soon.
	c := tc.NewClient(t, client.WithInstanceName(name), client.WithHeartbeatInterval(100*time.Millisecond))
	f := scaleout.NewFollower(c, group, nil)
	t.Cleanup(func() { _ = f.Close() })
	w, _, err := scaleout.Claim(ctx, scaleout.WriterConfig{Client: c, Producer: testutil.NewProducer(t, c, "chain_"+name),
		Follower: f, Group: group, Log: log, Worker: c.ClientID()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	s, err := checkpoint.Open(filepath.Join(t.TempDir(), name), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &scaleWorker{c: c, f: f, w: w, store: s}
}

func taskLogOf(job, stage, broker string, q int32) scaleout.TaskLog {
	ct, lt := scaleout.TopicName(job, stage, scaleout.KindCommit), scaleout.TopicName(job, stage, scaleout.KindChangelog)
	id := scaleout.TaskID{Stage: stage, Broker: broker, Queue: q}.String()
	return scaleout.TaskLog{Task: id, CommitTopic: ct, Commit: protocol.MessageQueue{Topic: ct, BrokerName: broker, QueueID: q},
		ChangelogTopic: lt, Changelog: protocol.MessageQueue{Topic: lt, BrokerName: broker, QueueID: q}}
}

// TestExactlyOnceScaleoutCheckBack: worker A's sink (task 0) writes a
// checkpoint's records and publishes the checkpoint, then dies before
// ending its half messages. The broker checks them back with the only
// producer of the group left: worker B's sink, of another task. B answers
// from the commit chain: commit for A's published epoch (all its records
// become visible once), unknown for A's unpublished next epoch until B
// claims A's task, then rollback. The control, a sink that answers from its
// own view as a job in one process does, rolls back A's published records:
// they would be lost.
func TestExactlyOnceScaleoutCheckBack(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) { testScaleoutCheckBack(t, control) })
	}
}

func testScaleoutCheckBack(t *testing.T, control bool) {
	ctx := context.Background()
	tc := testutil.RunCluster(t, broker.WithTransactionTimeout(200*time.Millisecond), broker.WithTransactionCheckInterval(50*time.Millisecond),
		broker.WithTransactionCheckMax(1000))
	cl := &cluster{t: t, b: tc.Broker, c: tc.NewClient(t)}
	cl.createTopic("eo_scale", 2)
	const job, group = "cbjob", "cbjob"
	if err := scaleout.EnsureTopics(ctx, cl.c, job, "st", scaleout.Layout{testutil.BrokerName: 2}, scaleout.KindCommit, scaleout.KindChangelog); err != nil {
		t.Fatal(err)
	}
	logA, logB := taskLogOf(job, "st", testutil.BrokerName, 0), taskLogOf(job, "st", testutil.BrokerName, 1)
	a := newScaleWorker(t, tc, "A", logA, group)
	b := newScaleWorker(t, tc, "B", logB, group)
	// A worker's follower follows every task of the job (RunWorker does).
	b.f.Follow(logA.Task, logA.Commit)

	sinkA, err := NewExactlyOnce(a.c, keyedMapper("eo_scale"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sinkA.Bind(jobinfo.Info{Job: job, UID: "out", Scaleout: &jobinfo.Scaleout{Task: logA.Task, OwnerEpoch: a.w.OwnerEpoch(),
		Chains: followerChains{a.f}}}); err != nil {
		t.Fatal(err)
	}
	if err := sinkA.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := sinkA.Write(ctx, keyed{Key: "k", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	txn, err := sinkA.PreCommit(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	info, err := sinkA.TxnInfo(txn)
	if err != nil {
		t.Fatal(err)
	}
	c := &checkpoint.Commit{ID: 1, Pending: []checkpoint.PendingCommit{{SinkUID: "out", CheckpointID: 1, Data: txn}}}
	a.w.PrepareCommit(c)
	md, err := a.store.Commit(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.w.Publish(ctx, md, c.Batch, []scaleout.SinkTxn{{Sink: "out", Epoch: 1, Info: info}}); err != nil {
		t.Fatal(err)
	}
	for i := 6; i < 10; i++ { // epoch 2: never published
		if err := sinkA.Write(ctx, keyed{Key: "k", Seq: i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sinkA.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A dies: its connections close (the broker forgets its producer of
	// the group) without ending a half message.
	if err := sinkA.Close(); err != nil {
		t.Fatal(err)
	}
	_ = a.w.Close()
	_ = a.f.Close()
	_ = a.c.Close()

	sinkB, err := NewExactlyOnce(b.c, keyedMapper("eo_scale"))
	if err != nil {
		t.Fatal(err)
	}
	defer sinkB.Close()
	bi := jobinfo.Info{Job: job, UID: "out"}
	if !control {
		bi.Scaleout = &jobinfo.Scaleout{Task: logB.Task, OwnerEpoch: b.w.OwnerEpoch(), Chains: followerChains{b.f}}
	}
	if err := sinkB.Bind(bi); err != nil {
		t.Fatal(err)
	}
	if err := sinkB.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if control {
		waitFor(t, "the control to answer A's half messages", 20*time.Second, func() bool {
			return cl.b.TransactionStats().RolledBack == 10
		})
		if got := cl.readTopic("eo_scale"); len(got) != 0 {
			t.Fatalf("control: %d records visible", len(got))
		}
		t.Logf("control: a sink answering from its own view rolled back all 10 half messages, the 6 of A's published checkpoint included")
		return
	}
	waitFor(t, "A's published epoch to be committed by B's answers", 20*time.Second, func() bool {
		return cl.b.TransactionStats().Committed == 6
	})
	// A's unpublished epoch stays undecided while A's task has no newer
	// owner...
	time.Sleep(500 * time.Millisecond) // several check-back rounds
	if st := cl.b.TransactionStats(); st.RolledBack != 0 || st.Committed != 6 {
		t.Fatalf("before the claim: %+v", st)
	}
	// ...and is rolled back once B claims A's task.
	newScaleWorker(t, tc, "B-takes-A", logA, group)
	waitFor(t, "A's unpublished epoch to be rolled back after the claim", 20*time.Second, func() bool {
		return cl.b.TransactionStats().RolledBack == 4
	})
	// Check-back answers commit the half messages in whatever order the
	// broker ends them (the owner's own commit keeps the lane order): each
	// record once.
	got := cl.readTopic("eo_scale")
	slices.SortFunc(got, func(a, b protocol.MessageExt) int { return cmp.Compare(seqOf(t, a), seqOf(t, b)) })
	checkOnceInOrder(t, got, 1, 6)
}

func seqOf(t *testing.T, m protocol.MessageExt) int {
	_, s, _ := strings.Cut(string(m.Body), ":")
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("body %q: %v", m.Body, err)
	}
	return n
}

// TestTxnInfoTellsOrphans: a transaction whose slot 2 was accepted on its
// third attempt describes itself in version 2, and its check-back
// information names that attempt for slot 2 and the first for the others;
// a slot it does not have is an error.
func TestTxnInfoTellsOrphans(t *testing.T) {
	d := &txnDesc{checkpoint: 4, run: "r", epoch: 4, retried: []retriedSlot{{slot: 2, try: 3}}}
	for i := range 4 {
		d.handles = append(d.handles, txnHandle{h: client.TxHandle{ProducerGroup: "g", Topic: "t", BrokerName: "b", BrokerAddr: "a",
			MsgID: fmt.Sprint("m", i), CommitLogOffset: int64(i)}})
	}
	b := appendTxn(nil, d)
	if b[2] != txnVersion2 {
		t.Fatalf("version %d", b[2])
	}
	back, err := decodeTxn(b)
	if err != nil || len(back.retried) != 1 || back.retried[0] != d.retried[0] {
		t.Fatalf("decode: %+v %v", back, err)
	}
	info, err := txnInfo(b)
	if err != nil {
		t.Fatal(err)
	}
	for slot, want := range []uint32{1, 1, 3, 1} {
		if got, err := acceptedTry(info, uint32(slot)); err != nil || got != want {
			t.Fatalf("slot %d: accepted attempt %d (%v), want %d", slot, got, err, want)
		}
	}
	if _, err := acceptedTry(info, 4); err == nil {
		t.Fatal("slot 4 of 4 accepted")
	}
	d.retried = nil
	if v1 := appendTxn(nil, d); v1[2] != txnVersion {
		t.Fatalf("no retries: version %d, want 1 (existing checkpoints keep their format)", v1[2])
	}
}
