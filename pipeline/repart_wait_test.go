package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// undecided is a decider whose every verdict is Undecided; Changed's
// channel is closed by the test.
type undecided struct {
	calls int
	ch    chan struct{}
}

func (u *undecided) Decide(string, uint64, uint64) (scaleout.Verdict, error) {
	u.calls++
	return scaleout.Undecided, nil
}

func (u *undecided) Changed() <-chan struct{} { return u.ch }

// TestRepartSourceWaitsOnUndecidedBatch: a repartition reader whose head
// batch is undecided asks its origin's chain again only after a chain
// changed. Deciding again at every poll made the keyed task's loop spin
// until the origin's checkpoint was published (most of a worker's CPU in
// BenchmarkScaleoutETL).
func TestRepartSourceWaitsOnUndecidedBatch(t *testing.T) {
	body := appendRepartHeader(nil, repartHeader{origin: "src@broker-a/0", ownerEpoch: 1, epoch: 1, seq: 1})
	dec := &undecided{ch: make(chan struct{})}
	s := &repartSource{q: protocol.MessageQueue{Topic: "t", BrokerName: "broker-a"}, dec: dec,
		pos: &repartPosition{origins: map[string]*originState{}}, queued: []protocol.MessageExt{{QueueOffset: 0, Body: body}}}
	if _, _, ok, err := s.poll(context.Background()); ok || err != nil {
		t.Fatalf("first poll of an undecided batch: ok %v, err %v", ok, err)
	}
	if dec.calls != 1 {
		t.Fatalf("decided %d times, want 1", dec.calls)
	}
	// Polled again before any chain changed: it waits (here until ctx
	// ends) instead of deciding again.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, ok, err := s.poll(ctx); ok || err != nil {
		t.Fatalf("second poll: ok %v, err %v", ok, err)
	}
	if dec.calls != 1 {
		t.Fatalf("polled again with no chain changed: decided %d times, want 1", dec.calls)
	}
	// A chain changed: it decides again.
	close(dec.ch)
	dec.ch = make(chan struct{})
	if _, _, ok, err := s.poll(context.Background()); ok || err != nil {
		t.Fatalf("poll after a change: ok %v, err %v", ok, err)
	}
	if dec.calls != 2 {
		t.Fatalf("after a chain changed: decided %d times, want 2", dec.calls)
	}
}
