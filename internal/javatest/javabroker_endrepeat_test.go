package javatest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestJavaBrokerEndTransactionRepeat measures what the exactly-once sink
// must not assume of Apache RocketMQ's broker (5.3.3 and 4.9.7), next to
// runnel's: a half message committed with END_TRANSACTION and committed
// again (as a restore repeating a checkpoint's commit does) is stored
// twice by Java's broker — EndTransactionProcessor finds the half message
// by its commit log offset whether or not it was ended already — and once
// by runnel's, which answers a repeat of the same end as done. A
// check-back that reaches the producer after its END_TRANSACTION commit
// (5.3.3 writes its "ended" op records in batches, every 3 s) and is
// answered commit stores it once more on 5.3.3; 4.9.7 writes the op record
// with the end and is not seen to check back an ended half message.
func TestJavaBrokerEndTransactionRepeat(t *testing.T) {
	t.Run("runnel", func(t *testing.T) {
		t.Parallel()
		cl := testutil.RunCluster(t)
		c := cl.NewClient(t)
		qs := testutil.CreateTopic(t, c, cl.BrokerAddr, uniqueName(t, "endrep"), 1)
		got := endRepeat(t, c, qs[0], false)
		if got.repeated != 1 {
			t.Fatalf("runnel's broker stored a twice-committed half message %d times", got.repeated)
		}
	})
	for _, v := range brokerVersions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			_, jc := javaCluster(t, v)
			awaitRegistered(t, jc)
			c := newJavaClient(t, jc)
			qs := createJavaTopic(t, c, jc, uniqueName(t, "endrep"), 1)
			got := endRepeat(t, c, qs[0], v == javapeer.Version5)
			if got.repeated != 2 {
				t.Fatalf("Apache RocketMQ %s stored a twice-committed half message %d times (the sink's restore assumes 2)", v, got.repeated)
			}
			if v == javapeer.Version4 && got.lateChecks != 0 {
				t.Fatalf("Apache RocketMQ 4.9.7 checked back %d ended half messages", got.lateChecks)
			}
			if got.lateChecks > 0 && got.lateCopies != got.lateChecks {
				t.Fatalf("%d check-backs after END commit answered commit, %d extra copies", got.lateChecks, got.lateCopies)
			}
		})
	}
}

type endRepeatResult struct {
	repeated   int // copies of the half message committed twice (less those of its late check-backs)
	lateChecks int // check-backs answered commit for halves already committed
	lateCopies int // extra copies stored by answering them
}

// endRepeat commits a half message twice on q's broker and counts its
// copies; with late, it also commits half messages just before the
// broker's transaction timeout, answers commit to every check-back of
// them and counts the extra copies.
func endRepeat(t *testing.T, c *client.Client, q protocol.MessageQueue, late bool) endRepeatResult {
	ctx := bg(t, 2*time.Minute)
	var mu sync.Mutex
	checks := map[string]int{} // check-backs after the body's END commit returned
	early := map[string]int{}  // and before
	ended := map[string]bool{}
	p := newJavaProducer(t, c, uniqueName(t, "endrepg"), client.WithCheckListener(func(_ context.Context, m *protocol.MessageExt) client.TxState {
		mu.Lock()
		defer mu.Unlock()
		if ended[string(m.Body)] {
			checks[string(m.Body)]++
		} else {
			early[string(m.Body)]++
		}
		return client.TxCommit
	}))
	half := func(body string) client.TxHandle {
		t.Helper()
		qq := q
		h, err := p.SendHalf(ctx, &client.Message{Topic: q.Topic, Body: []byte(body), Queue: &qq})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	commit := func(h client.TxHandle) {
		t.Helper()
		if err := p.EndTransaction(ctx, h, true); err != nil {
			t.Fatalf("commit %s: %v", h.MsgID, err)
		}
	}
	h := half("twice")
	commit(h)
	mu.Lock()
	ended["twice"] = true
	mu.Unlock()
	commit(h)
	var lateBodies []string
	if late {
		// The shared cluster's transaction timeout is 3 s and its check
		// interval 5 s: a half message committed at an age of ~2.5 s has
		// its op record written up to 3 s later, so a check in between
		// sees it pending.
		var wg sync.WaitGroup
		for i := range 4 {
			body := fmt.Sprintf("late-%d", i)
			lateBodies = append(lateBodies, body)
			h := half(body)
			wg.Go(func() {
				time.Sleep(2200*time.Millisecond + time.Duration(i)*200*time.Millisecond)
				if err := p.EndTransaction(ctx, h, true); err != nil {
					t.Errorf("commit %s: %v", body, err)
				}
				mu.Lock()
				ended[body] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		time.Sleep(12 * time.Second) // two check rounds and an op batch after the last commit
	} else {
		time.Sleep(time.Second)
	}
	var n map[string]int
	testutil.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		n = countBodies(pullAll(t, c, q, uniqueName(t, "endrepr"), 0, 1<<20, 0))
		if n["twice"] < 1 {
			return fmt.Errorf("committed message not visible: %v", n)
		}
		for _, b := range lateBodies {
			if n[b] < 1 {
				return fmt.Errorf("committed %s not visible: %v", b, n)
			}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	// A check-back of "twice" (after its commits) answered commit stores
	// one more copy.
	r := endRepeatResult{repeated: n["twice"] - checks["twice"], lateChecks: checks["twice"], lateCopies: checks["twice"]}
	for _, b := range lateBodies {
		r.lateChecks += checks[b]
		r.lateCopies += n[b] - 1 - early[b]
	}
	t.Logf("copies %v; check-backs of committed half messages %v (before their commit %v)", n, checks, early)
	return r
}
