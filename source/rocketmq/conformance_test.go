package rocketmq

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/source/sourcetest"
	"github.com/runnel-dev/runnel/transport/client"
)

// mqHarness makes conformance instances of the RocketMQ source on one
// embedded cluster, each over a topic of its own with two queues.
type mqHarness struct {
	cl     *cluster
	name   string // topic prefix, unique on the cluster
	topics atomic.Int64
	opts   []Option
	tagged bool // every other message has tag "skip", filtered out
}

// instance creates a topic holding n messages the source returns and
// builds the source with build.
func (h *mqHarness) instance(t *testing.T, n int) (string, *Source, sourcetest.Instance[Message]) {
	t.Helper()
	topic := fmt.Sprintf("conformance_%s_%d", h.name, h.topics.Add(1))
	h.cl.createTopic(topic, 2)
	opts := h.opts
	if h.tagged {
		opts = append([]Option{WithTagFilter("keep")}, opts...)
	}
	src, err := New(h.cl.c, topic, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() }) // queue locks, if any
	seq := 0
	// produce sends n messages the source returns (and as many it filters
	// out, when tagged) round-robin to the queues below queues, and
	// returns their bodies.
	produce := func(n, from, queues int) []string {
		var keys []string
		for i := range n {
			q := from + i%queues
			if h.tagged {
				h.cl.produce(topic, q, &client.Message{Body: fmt.Appendf(nil, "%s-skipped-%d", topic, seq), Tags: "skip"})
			}
			body := fmt.Sprintf("%s-%d", topic, seq)
			seq++
			h.cl.produce(topic, q, &client.Message{Body: []byte(body), Tags: "keep"})
			keys = append(keys, body)
		}
		return keys
	}
	inst := sourcetest.Instance[Message]{
		Source:  src,
		Key:     func(m Message) string { return string(m.Body) },
		Records: produce(n, 0, 2),
		Produce: func(_ context.Context, n int) ([]string, error) { return produce(n, 0, 2), nil },
		AddSplits: func(context.Context) ([]string, error) {
			h.cl.createTopic(topic, 3) // UPDATE_AND_CREATE_TOPIC: a third queue
			return produce(5, 2, 1), nil
		},
	}
	return topic, src, inst
}

func (h *mqHarness) factory(t *testing.T, n int) sourcetest.Instance[Message] {
	_, _, inst := h.instance(t, n)
	return inst
}

// TestSourceConformance runs the RocketMQ source through the source
// contract (sourcetest) on the embedded broker: unbounded from the
// earliest offset, bounded at the max offsets of the first open
// (StopAtLatest), with a TAG filter whose skipped messages move the
// offsets without being returned, with queue locks, and as a source of
// bodies (Bytes).
func TestSourceConformance(t *testing.T) {
	cl := newCluster(t)
	t.Run("Unbounded", func(t *testing.T) {
		h := &mqHarness{cl: cl, name: "unbounded"}
		sourcetest.Run(t, sourcetest.Features{}, h.factory)
	})
	t.Run("Bounded", func(t *testing.T) {
		h := &mqHarness{cl: cl, name: "bounded", opts: []Option{WithStop(StopAtLatest())}}
		sourcetest.Run(t, sourcetest.Features{Bounded: true}, h.factory)
	})
	t.Run("TagFilter", func(t *testing.T) {
		h := &mqHarness{cl: cl, name: "tagfilter", tagged: true}
		sourcetest.Run(t, sourcetest.Features{}, h.factory)
	})
	t.Run("QueueLocks", func(t *testing.T) {
		h := &mqHarness{cl: cl, name: "queuelocks", opts: []Option{WithQueueLocking(true)}}
		sourcetest.Run(t, sourcetest.Features{}, h.factory)
	})
	t.Run("Bytes", func(t *testing.T) {
		h := &mqHarness{cl: cl, name: "bytes", opts: []Option{WithStop(StopAtLatest())}}
		sourcetest.Run(t, sourcetest.Features{Bounded: true}, func(t *testing.T, n int) sourcetest.Instance[[]byte] {
			_, src, inst := h.instance(t, n)
			return sourcetest.Instance[[]byte]{
				Source:    src.Bytes(),
				Key:       func(b []byte) string { return string(b) },
				Records:   inst.Records,
				Produce:   inst.Produce,
				AddSplits: inst.AddSplits,
			}
		})
	})
}
