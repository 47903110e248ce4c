package javatest

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/jobinfo"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
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

// TestJavaBrokerExactlyOnceCheckBackAfterCommit: the exactly-once sink
// commits an epoch whose half messages are close to the broker's
// transaction timeout (3 s on the shared clusters); Apache RocketMQ 5.3.3,
// whose "ended" op records are written in batches, then checks back half
// messages the sink already committed. The sink answers rollback (a no-op
// for the broker), so every record is visible once — in one process, and
// as the task of a scale-out job, whose sink asks the job's commit chains
// (here a real chain on the Java broker, which says the epoch is valid)
// only for half messages it knows nothing of: answering from the chain, it
// would commit them again. 4.9.7 writes the op record with the end and
// checks nothing back.
func TestJavaBrokerExactlyOnceCheckBackAfterCommit(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		for _, scale := range []bool{false, true} {
			t.Run(fmt.Sprintf("scaleout=%v", scale), func(t *testing.T) {
				t.Parallel()
				testCheckBackAfterCommit(t, d, c, scale)
			})
		}
	})
}

func testCheckBackAfterCommit(t *testing.T, d *javapeer.Dist, jc *javapeer.Cluster, scale bool) {
	requireFailpoints(t)
	ctx := bg(t, 2*time.Minute)
	cl := newJavaClient(t, jc, client.WithHeartbeatInterval(500*time.Millisecond))
	topic := uniqueName(t, "cbout")
	qs := createJavaTopic(t, cl, jc, topic, 1)
	job := uniqueName(t, "cbjob")
	var checks, committed atomic.Int64 // committed: the highest epoch committed
	var checksAfter atomic.Int64
	s, err := mqsink.NewExactlyOnce(cl, func(i int) (*client.Message, error) {
		return &client.Message{Topic: topic, Body: []byte("k:" + strconv.Itoa(i)), ShardingKey: "k"}, nil
	}, phaseHook(func(p mqsink.Phase, epoch uint64) {
		if p == mqsink.PhaseCheckBack {
			checks.Add(1)
			if epoch <= uint64(committed.Load()) {
				checksAfter.Add(1)
			}
		}
	})...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	info := jobinfo.Info{Job: job, UID: "out"}
	var publish func(id uint64, txn []byte)
	if scale {
		if err := scaleout.EnsureTopics(ctx, cl, job, "st", scaleout.Layout{jc.BrokerName: 1}, scaleout.KindCommit, scaleout.KindChangelog); err != nil {
			t.Fatal(err)
		}
		ct, lt := scaleout.TopicName(job, "st", scaleout.KindCommit), scaleout.TopicName(job, "st", scaleout.KindChangelog)
		task := scaleout.TaskID{Stage: "st", Broker: jc.BrokerName, Queue: 0}.String()
		tl := scaleout.TaskLog{Task: task, CommitTopic: ct, Commit: protocol.MessageQueue{Topic: ct, BrokerName: jc.BrokerName, QueueID: 0},
			ChangelogTopic: lt, Changelog: protocol.MessageQueue{Topic: lt, BrokerName: jc.BrokerName, QueueID: 0}}
		f := scaleout.NewFollower(cl, job, nil)
		t.Cleanup(func() { _ = f.Close() })
		w, _, err := scaleout.Claim(ctx, scaleout.WriterConfig{Client: cl, Producer: newJavaProducer(t, cl, uniqueName(t, "chain")),
			Follower: f, Group: job, Log: tl, Worker: cl.ClientID()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		f.Follow(task, tl.Commit)
		store, err := checkpoint.Open(filepath.Join(t.TempDir(), "ckpt"), checkpoint.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		info.Scaleout = &jobinfo.Scaleout{Task: task, OwnerEpoch: w.OwnerEpoch(), Chains: followerChains{f}}
		publish = func(id uint64, txn []byte) {
			ti, err := s.TxnInfo(txn)
			if err != nil {
				t.Fatal(err)
			}
			c := &checkpoint.Commit{ID: id, Pending: []checkpoint.PendingCommit{{SinkUID: "out", CheckpointID: id, Data: txn}}}
			w.PrepareCommit(c)
			md, err := store.Commit(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Publish(ctx, md, c.Batch, []scaleout.SinkTxn{{Sink: "out", Epoch: id, Info: ti}}); err != nil {
				t.Fatal(err)
			}
			// The chain says the epoch counts: a sink answering from it
			// alone commits every check-back.
			testutil.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
				if v, err := f.Decide(task, w.OwnerEpoch(), id); v != scaleout.Valid {
					return fmt.Errorf("chain of epoch %d: %v (%v)", id, v, err)
				}
				return nil
			})
		}
	}
	if err := s.Bind(info); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Up to eight epochs, 700 ms apart, each committed 2.9 s after its
	// first record (just before the 3 s transaction timeout): its op
	// records are written up to 3 s later, and 5.3.3 checks back, every 5
	// s, what has no op record yet, so commits spread over more than a
	// check round are checked back. No new epoch starts once one was.
	const n, maxEpochs = 8, 8
	type step struct {
		at     time.Duration
		commit bool
		id     uint64
	}
	var plan []step
	for e := range uint64(maxEpochs) {
		at := time.Duration(e) * 700 * time.Millisecond
		plan = append(plan, step{at: at, id: e + 1}, step{at: at + 2900*time.Millisecond, commit: true, id: e + 1})
	}
	slices.SortStableFunc(plan, func(a, b step) int { return cmp.Compare(a.at, b.at) })
	start := time.Now()
	txns := map[uint64][]byte{}
	epochs := 0
	for _, st := range plan {
		if !st.commit && checksAfter.Load() > 0 {
			continue
		}
		if st.commit && txns[st.id] == nil {
			continue
		}
		time.Sleep(time.Until(start.Add(st.at)))
		if st.commit {
			if err := s.Commit(ctx, txns[st.id]); err != nil {
				t.Fatal(err)
			}
			committed.Store(int64(st.id))
			continue
		}
		epochs++
		for i := range n {
			if err := s.Write(ctx, int(st.id)*100+i); err != nil {
				t.Fatal(err)
			}
		}
		txn, err := s.PreCommit(ctx, st.id)
		if err != nil {
			t.Fatal(err)
		}
		txns[st.id] = txn
		if publish != nil {
			publish(st.id, txn)
		}
	}
	time.Sleep(8 * time.Second) // a check round and an op batch after the last commit, and a commit answer's copy
	got := countBodies(readAll(t, cl, qs, uniqueName(t, "cbr")))
	t.Logf("%d epochs: check-backs %d (%d after their commit); visible %d records", epochs, checks.Load(), checksAfter.Load(), len(got))
	for e := 1; e <= epochs; e++ {
		for i := range n {
			if k := "k:" + strconv.Itoa(e*100+i); got[k] != 1 {
				t.Errorf("%s visible %d times", k, got[k])
			}
		}
	}
	if len(got) != epochs*n {
		t.Errorf("%d distinct records visible, want %d", len(got), epochs*n)
	}
	if d.Version == javapeer.Version5 && checksAfter.Load() == 0 {
		t.Logf("no check-back of a committed half message in %d epochs: this run checked nothing", epochs)
	}
}

// TestJavaBrokerExactlyOnceLostEndAnswers: the answers of three
// END_TRANSACTION commits the Java broker applied are lost
// (failpoint.Tx.LoseEndAnswers: the sink sees an unknown outcome, as after a
// timeout or a connection closed in flight). The sink asks the output
// queue whether they were committed before sending them again, and every
// record is visible once; the control, sending them again blindly
// (failpoint.Tx.BlindEndRetry), makes the Java broker store those three twice.
func TestJavaBrokerExactlyOnceLostEndAnswers(t *testing.T) {
	requireFailpoints(t)
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		for _, control := range []bool{false, true} {
			t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) {
				t.Parallel()
				ctx := bg(t, time.Minute)
				cl := newJavaClient(t, c)
				topic := uniqueName(t, "lost")
				qs := createJavaTopic(t, cl, c, topic, 2)
				const n, lost = 40, 3
				s, err := mqsink.NewExactlyOnce(cl, func(i int) (*client.Message, error) {
					return &client.Message{Topic: topic, Body: []byte("r" + strconv.Itoa(i)), ShardingKey: strconv.Itoa(i % 7)}, nil
				}, append(txFaults(failpoint.Tx{LoseEndAnswers: lost, BlindEndRetry: control}), mqsink.WithTxGroup(uniqueName(t, "lostg")))...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				if err := s.Recover(ctx, nil); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if err := s.Write(ctx, i); err != nil {
						t.Fatal(err)
					}
				}
				txn, err := s.PreCommit(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				if err := s.Commit(ctx, txn); err != nil {
					t.Fatal(err)
				}
				took := time.Since(start)
				var got map[string]int
				testutil.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
					got = countBodies(readAll(t, cl, qs, uniqueName(t, "lostr")))
					if len(got) < n {
						return fmt.Errorf("%d of %d records visible", len(got), n)
					}
					return nil
				})
				dups := 0
				for i := range n {
					switch k := got["r"+strconv.Itoa(i)]; {
					case k == 0:
						t.Fatalf("r%d missing", i)
					case k > 1:
						dups += k - 1
					}
				}
				t.Logf("commit took %v; %d records, %d duplicated", took.Round(time.Millisecond), n, dups)
				switch {
				case control && dups != lost:
					t.Fatalf("control: %d duplicates, want %d (the Java broker stores a commit sent again)", dups, lost)
				case !control && dups != 0:
					t.Fatalf("%d records visible twice after %d lost commit answers", dups, lost)
				}
			})
		}
	})
}
