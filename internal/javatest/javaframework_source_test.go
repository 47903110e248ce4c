package javatest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// sendTo stores one message per body in q, one send each (so that their
// store timestamps follow one another), and returns their store
// timestamps as the broker reports them.
func sendTo(t *testing.T, cl *client.Client, p *client.Producer, q protocol.MessageQueue, bodies ...string) []int64 {
	t.Helper()
	ctx := bg(t, 30*time.Second)
	var offs []int64
	for _, b := range bodies {
		qq := q
		res, err := p.Send(ctx, &client.Message{Topic: q.Topic, Body: []byte(b), Queue: &qq})
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, res.QueueOffset)
	}
	var ts []int64
	for _, off := range offs {
		ms := pullAll(t, cl, q, "javatest_src_probe", off, 1, 10*time.Second)
		if len(ms) == 0 {
			t.Fatalf("message at %d of %s not readable", off, q)
		}
		ts = append(ts, ms[0].StoreTimestamp)
	}
	return ts
}

func seqBodies(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, prefix+strconv.Itoa(i))
	}
	return out
}

// pollSplit polls r until want records came (then checks that nothing
// more comes within a short while when bounded is false) or, with bounded,
// until ErrEndOfSplit, which must come after exactly want records. It
// returns the bodies.
func pollSplit(t *testing.T, r source.SplitReader[srcmq.Message], want int, bounded bool) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(30 * time.Second)
	quiet := time.Time{}
	for {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d records %q, want %d", 30*time.Second, len(got), got, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		recs, err := r.Poll(ctx, 100)
		cancel()
		for i := range recs {
			got = append(got, string(recs[i].Value.Body))
		}
		switch {
		case errors.Is(err, source.ErrEndOfSplit):
			if !bounded || len(got) != want {
				t.Fatalf("end of split after %q, want %d records (bounded %v)", got, want, bounded)
			}
			return got
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			t.Fatal(err)
		}
		if !bounded && len(got) >= want {
			if quiet.IsZero() {
				quiet = time.Now().Add(700 * time.Millisecond)
			}
			if time.Now().After(quiet) {
				if len(got) != want {
					t.Fatalf("read %q, want %d records", got, want)
				}
				return got
			}
		}
	}
}

func wantBodies(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: read %q, want %q", what, got, want)
	}
}

// TestJavaBrokerSourceStartStop: the RocketMQ source on Apache RocketMQ's
// broker, split by split (Open, Poll): every start position (earliest,
// latest, a timestamp between two messages, explicit offsets, the group's
// offset on the broker, a checkpointed offset) and stop position (latest,
// explicit offsets, a timestamp), and the split's lag from the broker's
// max offset (source.LagReporter).
func TestJavaBrokerSourceStartStop(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "src")
		qs := createJavaTopic(t, cl, c, topic, 2)
		q := qs[0]
		for _, qq := range qs {
			if qq.QueueID == 0 {
				q = qq
			}
		}
		split := q.BrokerName + "/0"
		p := newJavaProducer(t, cl, uniqueName(t, "srcp"))
		// a0..a4, then (400 ms after a4 was stored) a5..a9: T is 1 ms
		// after a4's store time, far closer to it than to a5's.
		ts := sendTo(t, cl, p, q, seqBodies("a", 0, 5)...)
		tAt := time.UnixMilli(ts[4] + 1)
		time.Sleep(time.Until(tAt.Add(400 * time.Millisecond)))
		sendTo(t, cl, p, q, seqBodies("a", 5, 10)...)
		group := uniqueName(t, "srcg")
		newSrc := func(opts ...srcmq.Option) *srcmq.Source {
			t.Helper()
			s, err := srcmq.New(cl, topic, append([]srcmq.Option{srcmq.WithGroup(group), srcmq.WithOffsetReporting(false),
				srcmq.WithPollTimeout(200 * time.Millisecond)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		open := func(s *srcmq.Source, restored []byte) source.SplitReader[srcmq.Message] {
			t.Helper()
			ctx := bg(t, 20*time.Second)
			if _, err := s.Splits(ctx); err != nil {
				t.Fatal(err)
			}
			r, err := s.Open(ctx, source.Split{ID: split}, restored)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close() })
			return r
		}
		all := seqBodies("a", 0, 10)

		wantBodies(t, "earliest to latest", pollSplit(t, open(newSrc(srcmq.WithStop(srcmq.StopAtLatest())), nil), 10, true), all...)
		wantBodies(t, "offsets 3 to 7", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.Offsets(map[string]int64{split: 3}, srcmq.Latest())),
			srcmq.WithStop(srcmq.StopAtOffsets(map[string]int64{split: 7}))), nil), 4, true), all[3:7]...)
		wantBodies(t, "from a timestamp between a4 and a5", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.AtTimestamp(tAt)),
			srcmq.WithStop(srcmq.StopAtLatest())), nil), 5, true), all[5:]...)
		// From a4's store time: a4 and whatever was stored in the same
		// millisecond before it.
		from4 := 4
		for from4 > 0 && ts[from4-1] == ts[4] {
			from4--
		}
		wantBodies(t, "from a4's store time", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.AtTimestamp(time.UnixMilli(ts[4]))),
			srcmq.WithStop(srcmq.StopAtLatest())), nil), 10-from4, true), all[from4:]...)
		wantBodies(t, "from a timestamp after every message", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.AtTimestamp(time.Now().Add(time.Hour))),
			srcmq.WithStop(srcmq.StopAtLatest())), nil), 0, true))
		wantBodies(t, "earliest until a timestamp", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.Earliest()),
			srcmq.WithStop(srcmq.StopAtTimestamp(tAt, time.Second)), srcmq.WithStoreTime()), nil), 5, true), all[:5]...)
		wantBodies(t, "the group's offset, none committed: the fallback", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.GroupOffset(srcmq.Earliest())),
			srcmq.WithStop(srcmq.StopAtLatest())), nil), 10, true), all...)
		if err := cl.CommitOffset(bg(t, 10*time.Second), group, q, 6); err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
			off, err := cl.QueryConsumerOffset(bg(t, 10*time.Second), group, q)
			if err != nil || off != 6 {
				return fmt.Errorf("group offset %d (%v), want 6", off, err)
			}
			return nil
		})
		wantBodies(t, "the group's committed offset", pollSplit(t, open(newSrc(srcmq.WithStart(srcmq.GroupOffset(srcmq.Earliest())),
			srcmq.WithStop(srcmq.StopAtLatest())), nil), 4, true), all[6:]...)

		// Unbounded from earliest: four records, the offset checkpointed,
		// then the lag is what the broker holds beyond it.
		r := open(newSrc(), nil)
		var first []string
		for len(first) < 4 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			recs, err := r.Poll(ctx, 4-len(first))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			for i := range recs {
				first = append(first, string(recs[i].Value.Body))
			}
		}
		wantBodies(t, "earliest, unbounded", first, all[:4]...)
		cp := append([]byte(nil), r.Offset()...)
		if err := r.NotifyCheckpointComplete(bg(t, 10*time.Second), 1); err != nil {
			t.Fatal(err)
		}
		lr, ok := r.(source.LagReporter)
		if !ok {
			t.Fatalf("%T is no source.LagReporter", r)
		}
		if lag, known := lr.Lag(); !known || lag != 6 {
			t.Fatalf("lag after checkpointing offset 4 of 10: %d (known %v), want 6", lag, known)
		}
		wantBodies(t, "restored from the checkpointed offset", pollSplit(t, open(newSrc(srcmq.WithStop(srcmq.StopAtLatest())), cp), 6, true), all[4:]...)

		// Latest: only what is stored after the split opened.
		rl := open(newSrc(srcmq.WithStart(srcmq.Latest())), nil)
		sendTo(t, cl, p, q, "b0", "b1", "b2")
		wantBodies(t, "latest", pollSplit(t, rl, 3, false), "b0", "b1", "b2")

		// A batch is stored with one store time: from that time, the whole
		// batch (4.9.7's search lands on any message of the batch).
		q1 := qs[0]
		for _, qq := range qs {
			if qq.QueueID == 1 {
				q1 = qq
			}
		}
		sendTo(t, cl, p, q1, "x0")
		time.Sleep(50 * time.Millisecond)
		var batch []*client.Message
		for _, b := range seqBodies("y", 0, 40) {
			qq := q1
			batch = append(batch, &client.Message{Topic: topic, Body: []byte(b), Queue: &qq})
		}
		res, err := p.Send(bg(t, 10*time.Second), batch...)
		if err != nil {
			t.Fatal(err)
		}
		ys := pullAll(t, cl, q1, "javatest_src_probe", res.QueueOffset, 40, 10*time.Second)
		if len(ys) != 40 || ys[0].StoreTimestamp != ys[39].StoreTimestamp {
			t.Logf("batch stored over %d ms", ys[len(ys)-1].StoreTimestamp-ys[0].StoreTimestamp)
		}
		s1 := newSrc(srcmq.WithStart(srcmq.AtTimestamp(time.UnixMilli(ys[0].StoreTimestamp))), srcmq.WithStop(srcmq.StopAtLatest()))
		if _, err := s1.Splits(bg(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		r1, err := s1.Open(bg(t, 10*time.Second), source.Split{ID: q1.BrokerName + "/1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r1.Close() })
		wantBodies(t, "from a batch's store time", pollSplit(t, r1, 40, true), seqBodies("y", 0, 40)...)
	})
}

// TestJavaBrokerSourceDiscovery: a job reading a 2-queue topic on the Java
// broker (its existing queues from Latest) while the topic grows to 4
// queues (UPDATE_AND_CREATE_TOPIC): after discovery the new queues are
// read from their min offset and their offsets are in the following
// checkpoints; with offset reporting on, the broker's offsets of the
// job's group follow the checkpoints (what lag tools read).
func TestJavaBrokerSourceDiscovery(t *testing.T) {
	eachBrokerParallel(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		cl := newJavaClient(t, c)
		topic := uniqueName(t, "grow")
		qs := createJavaTopic(t, cl, c, topic, 2)
		p := newJavaProducer(t, cl, uniqueName(t, "growp"))
		queue := func(id int32) protocol.MessageQueue {
			return protocol.MessageQueue{Topic: topic, BrokerName: qs[0].BrokerName, QueueID: id}
		}
		produce := func(id int32, prefix string, n int) {
			t.Helper()
			ctx := bg(t, 30*time.Second)
			q := queue(id)
			msgs := make([]*client.Message, n)
			for i := range msgs {
				msgs[i] = &client.Message{Topic: topic, Body: []byte(prefix + strconv.Itoa(i)), Queue: &q}
			}
			if _, err := p.Send(ctx, msgs...); err != nil {
				t.Fatal(err)
			}
		}
		produce(0, "old", 20) // before the start: skipped (Latest)
		src, err := srcmq.New(cl, topic, srcmq.WithStart(srcmq.Latest()), srcmq.WithPollTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		var mu sync.Mutex
		seen := map[int32]int{}
		jobName := uniqueName(t, "growjob")
		job := pipeline.New(jobName, pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(50*time.Millisecond),
			pipeline.DiscoveryInterval(0))
		pipeline.To(pipeline.FromSource(job, "in", src), "out", sink.NewFunc(func(_ context.Context, m srcmq.Message) error {
			mu.Lock()
			seen[m.QueueID]++
			mu.Unlock()
			return nil
		}, nil))
		committed := func() map[string]int64 {
			out := map[string]int64{}
			for _, s := range job.Status().Splits {
				b, err := hex.DecodeString(s.CommittedOffset)
				if err != nil {
					continue
				}
				if o, err := srcmq.DecodeOffset(b); err == nil {
					out[s.Split] = o.Next
				}
			}
			return out
		}
		id := func(q int32) string { return qs[0].BrokerName + "/" + strconv.Itoa(int(q)) }
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() {
			defer cancel()
			testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
				if c := committed(); len(c) < 2 {
					return fmt.Errorf("committed %v", c)
				}
				return nil
			})
			produce(0, "new", 10)
			if err := cl.CreateTopic(ctx, c.ClusterName, client.TopicConfig{TopicName: topic, ReadQueueNums: 4, WriteQueueNums: 4}); err != nil {
				t.Error(err)
				return
			}
			testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
				r, err := cl.RefreshRoute(ctx, topic)
				if err != nil || len(r.SubscribeQueues()) != 4 {
					return fmt.Errorf("route of %s: %v", topic, err)
				}
				return nil
			})
			produce(2, "q2-", 30)
			produce(3, "q3-", 30)
			job.DiscoverNow()
			testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
				mu.Lock()
				defer mu.Unlock()
				c := committed()
				if seen[0] != 10 || seen[2] != 30 || seen[3] != 30 || c[id(0)] != 30 || c[id(2)] != 30 || c[id(3)] != 30 {
					return fmt.Errorf("seen %v, committed %v", seen, c)
				}
				return nil
			})
			// The reported offsets, as the broker keeps them for the job's
			// group (srcmq.GroupName(job)).
			testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
				for q, want := range map[int32]int64{0: 30, 2: 30, 3: 30} {
					off, err := cl.QueryConsumerOffset(ctx, srcmq.GroupName(jobName), queue(q))
					if err != nil || off != want {
						return fmt.Errorf("broker's offset of %s for the group: %d (%v), want %d", id(q), off, err, want)
					}
				}
				return nil
			})
		})
		err = job.Run(ctx)
		wg.Wait()
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if t.Failed() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[0] != 10 || seen[1] != 0 || seen[2] != 30 || seen[3] != 30 {
			t.Fatalf("records by queue %v", seen)
		}
	})
}
