package scaleout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// kvPart puts key=value pairs into one operator's key group 0.
type kvPart map[string]string

func (p kvPart) WriteTo(w *checkpoint.Writer) error {
	for k, v := range p {
		if err := w.PutState("op", 0, []byte(k), []byte(v)); err != nil {
			return err
		}
	}
	return nil
}

type owner struct {
	t     *testing.T
	store *checkpoint.Store
	w     *Writer
	f     *Follower
}

// commit commits checkpoint id with kv into the owner's store and publishes
// it, as the runtime does with a CommitHook.
func (o *owner) commit(ctx context.Context, id uint64, kv kvPart) error {
	c := &checkpoint.Commit{ID: id, Parts: []checkpoint.Part{kv},
		Offsets: map[string][]byte{checkpoint.SplitKey("src", "q"): fmt.Appendf(nil, "%d", id)}}
	o.w.PrepareCommit(c)
	md, err := o.store.Commit(ctx, c)
	if err != nil {
		o.t.Fatal(err)
	}
	return o.w.Publish(ctx, md, c.Batch, []SinkTxn{{Sink: "out", Epoch: id, Info: []byte{byte(id)}}})
}

type rig struct {
	t     *testing.T
	cl    *testutil.Cluster
	job   string
	log   TaskLog
	group string
}

func newRig(t *testing.T) *rig {
	cl := testutil.RunCluster(t)
	c := cl.NewClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job := "chainjob"
	stage := "src"
	l := Layout{testutil.BrokerName: 2}
	if err := EnsureTopics(ctx, c, job, stage, l, KindCommit, KindChangelog); err != nil {
		t.Fatal(err)
	}
	task := TaskID{Stage: stage, Broker: testutil.BrokerName, Queue: 1}
	ct, lt := TopicName(job, stage, KindCommit), TopicName(job, stage, KindChangelog)
	return &rig{t: t, cl: cl, job: job, group: GroupName(job), log: TaskLog{Task: task.String(),
		CommitTopic: ct, Commit: protocol.MessageQueue{Topic: ct, BrokerName: task.Broker, QueueID: task.Queue},
		ChangelogTopic: lt, Changelog: protocol.MessageQueue{Topic: lt, BrokerName: task.Broker, QueueID: task.Queue}}}
}

// newOwner claims the task in a fresh worker (its own client, follower and
// store directory) and restores its store.
func (r *rig) newOwner(ctx context.Context, name, dir string, snapEvery int) (*owner, *Record, RestoreReport) {
	t := r.t
	c := r.cl.NewClient(t, client.WithInstanceName(name))
	p := testutil.NewProducer(t, c, "runnel_chain_"+name)
	f := NewFollower(c, r.group, nil)
	t.Cleanup(func() { _ = f.Close() })
	cfg := WriterConfig{Client: c, Producer: p, Follower: f, Group: r.group, Log: r.log, Worker: name, SnapshotEvery: snapEvery}
	w, base, err := Claim(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	v, err := f.View(r.log.Task)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Restore(ctx, c, r.group, r.log, dir, base, v, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &owner{t: t, store: s, w: w, f: f}, base, rep
}

func stateOf(t *testing.T, s *checkpoint.Store) string {
	t.Helper()
	var b bytes.Buffer
	err := s.ScanState("op", 0, nil, func(k, v []byte) bool { fmt.Fprintf(&b, "%s=%s ", k, v); return true })
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Latest()
	offs, _ := s.Offsets()
	return fmt.Sprintf("cp %d off %s: %s", m.ID, offs[checkpoint.SplitKey("src", "q")], b.String())
}

// TestWriterHandOverAndFence is the chain protocol against the embedded
// broker with real stores: owner A publishes checkpoints (with a snapshot
// among them); owner B, on an empty disk, claims the task and rebuilds A's
// store exactly from the broker; A's next publish, built on its older view,
// is fenced and counts for no reader; B goes on; a third owner on A's old
// disk reuses what it can and catches up from the changelog.
func TestWriterHandOverAndFence(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dirA := filepath.Join(t.TempDir(), "a")
	a, base, rep := r.newOwner(ctx, "A", dirA, 3)
	if base != nil || rep.Reused || rep.Applied != 0 {
		t.Fatalf("new task: base %v, report %+v", base, rep)
	}
	for id := uint64(1); id <= 5; id++ {
		if err := a.commit(ctx, id, kvPart{fmt.Sprint("k", id): fmt.Sprint("v", id)}); err != nil {
			t.Fatal(err)
		}
		a.w.MaybeSnapshot(a.store)
	}
	// Let the background snapshot finish, then one more checkpoint names it.
	if err := a.w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.commit(ctx, 6, kvPart{"k6": "v6"}); err != nil {
		t.Fatal(err)
	}
	wantA := stateOf(t, a.store)

	dirB := filepath.Join(t.TempDir(), "b")
	b, baseB, repB := r.newOwner(ctx, "B", dirB, 100)
	if baseB == nil || baseB.Seq != 6 {
		t.Fatalf("B's base %+v, want A's checkpoint 6", baseB)
	}
	if !repB.FromSnapshot || repB.Reused {
		t.Fatalf("B's restore %+v: want a rebuild from the snapshot", repB)
	}
	if got := stateOf(t, b.store); got != wantA {
		t.Fatalf("B rebuilt\n%s\nA had\n%s", got, wantA)
	}
	// A was paused through B's claim: its next checkpoint is fenced.
	err := a.commit(ctx, 7, kvPart{"zombie": "x"})
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("A's publish after B's claim: %v, want ErrFenced", err)
	}
	if v, _ := b.f.Decide(r.log.Task, a.w.OwnerEpoch(), 7); v != Invalid {
		t.Fatalf("a reader decides A's checkpoint 7 is %v, want invalid", v)
	}
	if v, _ := b.f.Decide(r.log.Task, a.w.OwnerEpoch(), 6); v != Valid {
		t.Fatalf("A's checkpoint 6: %v, want valid", v)
	}
	if err := b.commit(ctx, 7, kvPart{"k7": "v7"}); err != nil {
		t.Fatal(err)
	}
	// A's follower learns B's record as it long-polls: eventually.
	testutil.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if v, _ := a.f.Decide(r.log.Task, b.w.OwnerEpoch(), 7); v != Valid {
			return fmt.Errorf("A's follower decides B's checkpoint 7 is %v, want valid", v)
		}
		return nil
	})
	if info, ok := a.f.SinkInfo(r.log.Task, "out", 7); !ok || !bytes.Equal(info, []byte{7}) {
		t.Fatalf("sink info of checkpoint 7: %v %v", info, ok)
	}
	wantB := stateOf(t, b.store)
	_ = b.w.Close()

	// A third owner on A's old disk: A's store holds checkpoint 7 of its
	// own (fenced) epoch, which is not on the chain: rebuilt, not reused.
	_ = a.store.Close()
	_ = a.w.Close()
	c3, base3, rep3 := r.newOwner(ctx, "C", dirA, 100)
	if base3.Seq != 7 || rep3.Reused {
		t.Fatalf("C on A's disk: base %d, report %+v: A's fenced checkpoint 7 must not be reused", base3.Seq, rep3)
	}
	if got := stateOf(t, c3.store); got != wantB {
		t.Fatalf("C restored\n%s\nB had\n%s", got, wantB)
	}
	if bytes.Contains([]byte(stateOf(t, c3.store)), []byte("zombie")) {
		t.Fatal("the fenced owner's state reached the new owner")
	}
}

// TestWriterReusesLocalStore: an owner restarting on its own disk after its
// last checkpoint was published reuses the store (reads nothing).
func TestWriterReusesLocalStore(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "a")
	a, _, _ := r.newOwner(ctx, "A", dir, 100)
	for id := uint64(1); id <= 3; id++ {
		if err := a.commit(ctx, id, kvPart{fmt.Sprint("k", id): "v"}); err != nil {
			t.Fatal(err)
		}
	}
	want := stateOf(t, a.store)
	_ = a.store.Close()
	a2, base, rep := r.newOwner(ctx, "A2", dir, 100)
	if base.Seq != 3 || !rep.Reused || rep.Applied != 0 || rep.Bytes != 0 {
		t.Fatalf("restart on the same disk: base %d, report %+v", base.Seq, rep)
	}
	if got := stateOf(t, a2.store); got != want {
		t.Fatalf("reused store\n%s\nwant\n%s", got, want)
	}
}

// TestFollowerStartsBesideLiveOwner: a reader starts following a task
// while its owner publishes (and stores the hint) between the reader's
// reads of the hint and of the queue's bounds. The reader must not take the
// live chain for a truncated one: with the bounds read first, the newer
// hint named the record just past a stale end (CI saw "ends at 19 but ...
// confirmed at offset 19" in the scale-out demo).
func TestFollowerStartsBesideLiveOwner(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, _, _ := r.newOwner(ctx, "A", filepath.Join(t.TempDir(), "a"), 1000)
	for id := uint64(1); id <= 3; id++ {
		if err := a.commit(ctx, id, kvPart{"k": fmt.Sprint(id)}); err != nil {
			t.Fatal(err)
		}
	}
	f := NewFollower(r.cl.NewClient(t, client.WithInstanceName("reader")), r.group, nil)
	t.Cleanup(func() { _ = f.Close() })
	published := false
	f.betweenReads = func() {
		if !published {
			published = true
			if err := a.commit(ctx, 4, kvPart{"k": "4"}); err != nil {
				t.Error(err)
			}
		}
	}
	f.Follow(r.log.Task, r.log.Commit)
	if err := f.Ready(ctx, r.log.Task); err != nil {
		t.Fatalf("reader started beside the live owner: %v", err)
	}
	testutil.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		v, err := f.View(r.log.Task)
		if err != nil {
			return err
		}
		if v.Latest == nil || v.Latest.Seq != 4 {
			return fmt.Errorf("reader's latest record %+v, want checkpoint 4", v.Latest)
		}
		return nil
	})
}
