package client

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func TestPullLongPollingAndFilters(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	qs := e.createTopic(c, "PullT", 1)
	q := qs[0]
	p := newProducer(t, c, "pg")
	ctx := testCtx(t, 20*time.Second)

	// Empty queue, short suspend: the broker holds the pull, then NoNewMsg.
	start := time.Now()
	r, err := c.Pull(ctx, PullRequest{Queue: q, Offset: 0, Group: "g", Suspend: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != PullNoNewMsg || len(r.Messages) != 0 || r.NextBeginOffset != 0 {
		t.Fatalf("empty queue: %+v", r)
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("pull with 300ms suspend answered after %v: not long-polled", el)
	}
	// A long poll is woken by a send, long before its suspend time.
	time.AfterFunc(200*time.Millisecond, func() {
		_, _ = p.Send(ctx, &Message{Topic: "PullT", Body: []byte("wake"), Tags: "A"})
	})
	start = time.Now()
	r, err = c.Pull(ctx, PullRequest{Queue: q, Offset: 0, Group: "g", Suspend: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); r.Status != PullFound || el > 5*time.Second || string(r.Messages[0].Body) != "wake" {
		t.Fatalf("woken pull after %v: %+v", el, r)
	}
	// Tag filtering: B and C messages are skipped by an "A || C" filter.
	for i, tag := range []string{"B", "C", "B", "A"} {
		if _, err := p.Send(ctx, &Message{Topic: "PullT", Body: fmt.Appendf(nil, "%d-%s", i, tag), Tags: tag}); err != nil {
			t.Fatal(err)
		}
	}
	got := pullAll(t, c, q, 1, "A || C")
	var bodies []string
	for _, m := range got {
		bodies = append(bodies, string(m.Body))
	}
	if !slices.Equal(bodies, []string{"1-C", "3-A"}) {
		t.Fatalf("filtered bodies %v", bodies)
	}
	// Only B after offset 3: nothing matches.
	r, err = c.Pull(ctx, PullRequest{Queue: q, Offset: 3, Group: "g", Expression: "Z", MaxMsgs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != PullNoMatchedMsg || r.NextBeginOffset <= 3 {
		t.Fatalf("no match: %+v", r)
	}
	// MaxMsgs bounds the answer; min/max offsets come with it.
	r, err = c.Pull(ctx, PullRequest{Queue: q, Offset: 0, Group: "g", MaxMsgs: 2})
	if err != nil || r.Status != PullFound || len(r.Messages) != 2 || r.NextBeginOffset != 2 || r.MinOffset != 0 || r.MaxOffset != 5 {
		t.Fatalf("bounded pull: %v %+v", err, r)
	}
	// An offset past the end is illegal, with the corrected offset.
	r, err = c.Pull(ctx, PullRequest{Queue: q, Offset: 100, Group: "g"})
	if err != nil || r.Status != PullOffsetIllegal || r.NextBeginOffset != 5 {
		t.Fatalf("offset past the end: %v %+v", err, r)
	}
	// A queue the topic does not have is a broker error, not an outcome.
	_, err = c.Pull(ctx, PullRequest{Queue: protocol.MessageQueue{Topic: "PullT", BrokerName: "broker-a", QueueID: 9}, Group: "g"})
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		t.Fatalf("bad queue: %v", err)
	}
	if _, err := c.Pull(ctx, PullRequest{Queue: q, Group: ""}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("no group: %v", err)
	}
}

func TestPullOffsetsSearchAndCommit(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client()
	qs := e.createTopic(c, "OffT", 1)
	q := qs[0]
	p := newProducer(t, c, "pg")
	ctx := testCtx(t, 20*time.Second)
	if _, err := c.QueryConsumerOffset(ctx, "og", q); !errors.Is(err, ErrNoOffset) || !errors.Is(err, protocol.ErrQueryNotFound) {
		t.Fatalf("offset before commit: %v", err)
	}
	for i := range 3 {
		if _, err := p.Send(ctx, &Message{Topic: "OffT", Body: fmt.Appendf(nil, "early-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Store times have millisecond resolution: make sure the next batch is
	// stored strictly later than "mid".
	mid := time.Now().Add(5 * time.Millisecond)
	waitFor(t, time.Second, func() error {
		if time.Now().Before(mid.Add(5 * time.Millisecond)) {
			return errors.New("wait")
		}
		return nil
	})
	for i := range 2 {
		if _, err := p.Send(ctx, &Message{Topic: "OffT", Body: fmt.Appendf(nil, "late-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	minOff, err := c.MinOffset(ctx, q)
	if err != nil || minOff != 0 {
		t.Fatalf("min offset %d %v", minOff, err)
	}
	maxOff, err := c.MaxOffset(ctx, q)
	if err != nil || maxOff != 5 {
		t.Fatalf("max offset %d %v", maxOff, err)
	}
	at, err := c.SearchOffset(ctx, q, mid)
	if err != nil || at != 3 {
		t.Fatalf("search offset at mid: %d %v, want 3", at, err)
	}
	if at, err := c.SearchOffset(ctx, q, time.Now().Add(-time.Hour)); err != nil || at != 0 {
		t.Fatalf("search offset long ago: %d %v", at, err)
	}
	if err := c.CommitOffset(ctx, "og", q, 4); err != nil {
		t.Fatal(err)
	}
	if off, err := c.QueryConsumerOffset(ctx, "og", q); err != nil || off != 4 {
		t.Fatalf("committed offset %d %v", off, err)
	}
	// A pull can commit too (informational).
	if _, err := c.Pull(ctx, PullRequest{Queue: q, Offset: 4, Group: "og", CommitOffset: 5}); err != nil {
		t.Fatal(err)
	}
	if off, err := c.QueryConsumerOffset(ctx, "og", q); err != nil || off != 5 {
		t.Fatalf("offset committed by pull %d %v", off, err)
	}
	offs, err := c.ConsumerOffsets(ctx, "og", "OffT")
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := offs[q]; !ok || w.BrokerOffset != 5 || w.ConsumerOffset != 5 {
		t.Fatalf("consumer offsets %+v", offs)
	}
}

func TestAdminTopicsAndRouteRefresh(t *testing.T) {
	e := newCoreEnv(t)
	c := e.client(WithRouteRefreshInterval(50 * time.Millisecond))
	ctx := testCtx(t, 20*time.Second)
	ci, err := c.ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names := ci.ClusterAddrTable["DefaultCluster"]; len(names) != 1 || ci.BrokerAddrTable["broker-a"].MasterAddr() != e.brokers["broker-a"].addr {
		t.Fatalf("cluster info %+v", ci)
	}
	// Create by cluster name.
	if err := c.CreateTopic(ctx, "DefaultCluster", TopicConfig{TopicName: "AdminT", ReadQueueNums: 3, WriteQueueNums: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() error {
		r, err := c.RefreshRoute(ctx, "AdminT")
		if err != nil {
			return err
		}
		if n := len(r.PublishQueues()); n != 3 {
			return fmt.Errorf("%d queues", n)
		}
		return nil
	})
	topics, err := c.ListTopics(ctx)
	if err != nil || !slices.Contains(topics, "AdminT") {
		t.Fatalf("list topics %v %v", topics, err)
	}
	if err := c.CreateTopic(ctx, "NoCluster", TopicConfig{TopicName: "X"}); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("unknown cluster: %v", err)
	}
	// A producer sending to an unknown topic routes through TBW102; the
	// broker creates the topic and the refresh loop swaps in its real route.
	p := newProducer(t, c, "pg")
	if _, err := p.Send(ctx, &Message{Topic: "AutoT", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() error {
		c.routes.RLock()
		_, real := c.routes.m["AutoT"]
		_, def := c.routes.def["AutoT"]
		c.routes.RUnlock()
		if !real || def {
			return fmt.Errorf("AutoT route: real %v, derived %v", real, def)
		}
		return nil
	})
	if r, _ := c.Route(ctx, "AutoT"); len(r.PublishQueues()) != DefaultTopicQueueNums {
		t.Fatalf("auto-created topic has %d queues, want %d", len(r.PublishQueues()), DefaultTopicQueueNums)
	}
	// Delete.
	if err := c.DeleteTopic(ctx, "AdminT", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Route(ctx, "AdminT"); !errors.Is(err, protocol.ErrTopicNotExist) {
		t.Fatalf("route after delete: %v", err)
	}
}
