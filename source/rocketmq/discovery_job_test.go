package rocketmq

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
)

// TestJobDiscoversNewQueues runs a job on a 2-queue topic, grows the topic
// to 4 queues with UPDATE_AND_CREATE_TOPIC while it runs and asks for
// discovery: the new queues are read from their min offset (although the
// source starts existing queues at Latest), and their offsets are in the
// following checkpoints.
func TestJobDiscoversNewQueues(t *testing.T) {
	cl := newCluster(t)
	const topic = "grow_job"
	cl.createTopic(topic, 2)
	cl.produce(topic, 0, bodies("old", 20)...) // before the start: skipped (Latest)
	src, err := New(cl.c, topic, WithStart(Latest()), WithOffsetReporting(false), WithPollTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int32]int{}
	job := pipeline.New("discover-queues", pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(20*time.Millisecond),
		pipeline.DiscoveryInterval(0))
	in := pipeline.FromSource(job, "in", src)
	pipeline.To(in, "out", sink.NewFunc(func(_ context.Context, m Message) error {
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
			if o, err := DecodeOffset(b); err == nil {
				out[s.Split] = o.Next
			}
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel()
		// Both initial splits opened (their Latest offsets are checkpointed).
		testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			if c := committed(); len(c) < 2 {
				return fmt.Errorf("committed %v", c)
			}
			return nil
		})
		cl.produce(topic, 0, bodies("new", 10)...)
		cl.createTopic(topic, 4)
		cl.produce(topic, 2, bodies("q2-", 30)...)
		cl.produce(topic, 3, bodies("q3-", 30)...)
		job.DiscoverNow()
		testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			mu.Lock()
			defer mu.Unlock()
			c := committed()
			if seen[0] != 10 || seen[2] != 30 || seen[3] != 30 || c["broker-a/2"] != 30 || c["broker-a/3"] != 30 {
				return fmt.Errorf("seen %v, committed %v", seen, c)
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
}
