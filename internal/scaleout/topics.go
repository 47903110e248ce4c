package scaleout

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Layout is a stage's queue layout: the number of queues on each broker
// (by broker name). A stage's tasks are the queues of this layout; its
// commit and changelog topics (and a keyed stage's repartition topic) have
// exactly this layout, so task (broker, queue) finds its records on queue
// (broker, queue) of each.
type Layout map[string]int32

// Queues lists the layout's queues of topic, sorted.
func (l Layout) Queues(topic string) []protocol.MessageQueue {
	var qs []protocol.MessageQueue
	for _, b := range slices.Sorted(maps.Keys(l)) {
		for q := range l[b] {
			qs = append(qs, protocol.MessageQueue{Topic: topic, BrokerName: b, QueueID: q})
		}
	}
	return qs
}

// SourceLayout is the layout of a source topic's readable queues.
func SourceLayout(ctx context.Context, c *client.Client, topic string) (Layout, error) {
	r, err := c.RefreshRoute(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("scaleout: route of %s: %w", topic, err)
	}
	l := Layout{}
	for _, q := range r.SubscribeQueues() {
		l[q.BrokerName] = max(l[q.BrokerName], q.QueueID+1)
	}
	if len(l) == 0 {
		return nil, fmt.Errorf("scaleout: topic %s has no readable queue", topic)
	}
	return l, nil
}

// KeyedLayout places a keyed stage's ranges: n queues on the first broker
// (by name) of the cluster c's name servers know.
func KeyedLayout(ctx context.Context, c *client.Client, n int) (Layout, error) {
	ci, err := c.ClusterInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("scaleout: cluster info: %w", err)
	}
	names := slices.Sorted(maps.Keys(ci.BrokerAddrTable))
	if len(names) == 0 {
		return nil, fmt.Errorf("scaleout: the name servers list no broker")
	}
	return Layout{names[0]: int32(n)}, nil
}

// EnsureTopics creates (or grows) the job's topics of kinds for stage with
// layout l and waits, at most until ctx ends, until every queue is
// routable. Existing topics with more queues are left alone.
func EnsureTopics(ctx context.Context, c *client.Client, job, stage string, l Layout, kinds ...string) error {
	ci, err := c.ClusterInfo(ctx)
	if err != nil {
		return fmt.Errorf("scaleout: cluster info: %w", err)
	}
	for _, kind := range kinds {
		topic := TopicName(job, stage, kind)
		have := Layout{}
		if r, err := c.RefreshRoute(ctx, topic); err == nil {
			for _, q := range r.SubscribeQueues() {
				have[q.BrokerName] = max(have[q.BrokerName], q.QueueID+1)
			}
		}
		for b, n := range l {
			if have[b] >= n {
				continue
			}
			bd, ok := ci.BrokerAddrTable[b]
			if !ok {
				return fmt.Errorf("scaleout: broker %s of %s's layout is not in the cluster", b, stage)
			}
			addr, ok := bd.BrokerAddrs[0]
			if !ok {
				return fmt.Errorf("scaleout: broker %s has no master", b)
			}
			tc := client.TopicConfig{TopicName: topic, ReadQueueNums: n, WriteQueueNums: n, Perm: protocol.PermRead | protocol.PermWrite}
			if err := c.CreateTopic(ctx, addr, tc); err != nil {
				return fmt.Errorf("scaleout: create %s on %s: %w", topic, b, err)
			}
		}
		if err := waitRoutable(ctx, c, topic, l); err != nil {
			return err
		}
	}
	return nil
}

func waitRoutable(ctx context.Context, c *client.Client, topic string, l Layout) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		r, err := c.RefreshRoute(ctx, topic)
		if err == nil {
			have := Layout{}
			for _, q := range r.SubscribeQueues() {
				have[q.BrokerName] = max(have[q.BrokerName], q.QueueID+1)
			}
			pub := Layout{}
			for _, q := range r.PublishQueues() {
				pub[q.BrokerName] = max(pub[q.BrokerName], q.QueueID+1)
			}
			ok := true
			for b, n := range l {
				if have[b] < n || pub[b] < n {
					ok = false
				}
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("scaleout: topic %s not routable with layout %v: %w (last: %v)", topic, l, ctx.Err(), err)
		case <-t.C:
		}
	}
}
