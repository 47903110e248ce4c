package rocketmq

import (
	"context"
	"testing"

	"github.com/runnel-dev/runnel/transport/client"
)

// TestExactlyOnceCheckBackRules: the local view's answer for each case the
// package documentation lists under "Check-back answers", as the engine
// feeds it (Recover, PreCommit, StartCommit, a failed and a successful
// commit, Abort).
func TestExactlyOnceCheckBackRules(t *testing.T) {
	ctx := context.Background()
	const run = "this"
	desc := func(epoch uint64, ids ...string) *txnDesc {
		d := &txnDesc{checkpoint: epoch, run: run, epoch: epoch}
		for _, id := range ids {
			d.handles = append(d.handles, txnHandle{h: client.TxHandle{MsgID: id}})
		}
		return d
	}
	v := newLocalView(run)
	ask := func(name string, q halfQuery, want client.TxState) {
		t.Helper()
		if got := v.decide(ctx, q); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	// Before Recover every answer is unknown, even for an earlier run.
	ask("before Recover", halfQuery{run: "old", epoch: 1, msgID: "o1"}, client.TxUnknown)

	restored := desc(4, "r1", "r2")
	restored.run = "old"
	v.restore([]*txnDesc{restored})
	ask("listed by the restored checkpoint", halfQuery{run: "old", epoch: 4, msgID: "r1"}, client.TxUnknown)
	ask("earlier run, not listed", halfQuery{run: "old", epoch: 4, msgID: "o1"}, client.TxRollback)
	ask("this run's open epoch", halfQuery{run: run, epoch: 5, msgID: "a1"}, client.TxUnknown)

	v.commitFailed(restored, restored.handles, []bool{true, false})
	ask("durable, its commit failed here", halfQuery{run: "old", epoch: 4, msgID: "r2"}, client.TxCommit)
	ask("durable, committed here before the commit failed", halfQuery{run: "old", epoch: 4, msgID: "r1"}, client.TxRollback)
	v.forget(restored) // committed on a later try
	ask("committed on a later try (the broker checks it back no more)", halfQuery{run: "old", epoch: 4, msgID: "r2"}, client.TxRollback)

	sealed := desc(5, "a1", "a2")
	v.sealed(sealed)
	ask("pre-committed, checkpoint in flight", halfQuery{run: run, epoch: 5, msgID: "a1"}, client.TxUnknown)
	ask("orphan of a pre-committed epoch", halfQuery{run: run, epoch: 5, msgID: "a3"}, client.TxRollback)
	ask("this run's next (open) epoch", halfQuery{run: run, epoch: 6, msgID: "b1"}, client.TxUnknown)
	v.durable(sealed)
	ask("durable, being committed", halfQuery{run: run, epoch: 5, msgID: "a2"}, client.TxUnknown)
	v.forget(sealed)
	ask("committed by this run (the broker checks it back no more)", halfQuery{run: run, epoch: 5, msgID: "a2"}, client.TxRollback)

	// What a scale-out sink asks before its commit chains: its own part.
	for _, c := range []struct {
		name string
		q    halfQuery
		st   client.TxState
		ok   bool
	}{
		{"committed here (Apache RocketMQ 5.x checks back ended half messages)", halfQuery{run: run, epoch: 5, msgID: "a1"}, client.TxRollback, true},
		{"restored and committed here", halfQuery{run: "old", epoch: 4, msgID: "r2"}, client.TxRollback, true},
		{"being committed here", halfQuery{run: run, epoch: 6, msgID: "b1"}, client.TxUnknown, false},
		{"another worker's", halfQuery{run: "other", epoch: 5, msgID: "x1"}, client.TxUnknown, false},
	} {
		if c.name == "being committed here" {
			d := desc(6, "b1")
			v.sealed(d)
			v.durable(d)
			c.ok = true
		}
		if st, ok := v.own(c.q); st != c.st || ok != c.ok {
			t.Errorf("own: %s: %v %v, want %v %v", c.name, st, ok, c.st, c.ok)
		}
	}
}
