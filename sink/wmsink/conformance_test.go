package wmsink_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/sink/sinktest"
	"github.com/runnel-dev/runnel/sink/wmsink"
)

// TestConformance runs the watermill sink through the plain sink checks
// (sinktest) on a GoChannel: what a subscriber, subscribed before the
// first publish, has received is what is visible. At least once: a
// replayed record is published again.
func TestConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Features{}, func(t *testing.T) sinktest.System[string] {
		gc := gochannel.NewGoChannel(gochannel.Config{}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := gc.Subscribe(ctx, "out")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var got []string
		var wg sync.WaitGroup
		wg.Go(func() {
			for m := range ch {
				mu.Lock()
				got = append(got, m.UUID)
				mu.Unlock()
				m.Ack()
			}
		})
		t.Cleanup(func() {
			cancel()
			wg.Wait()
			_ = gc.Close()
		})
		return sinktest.System[string]{
			New: func(context.Context) (sink.Sink[string], error) {
				return wmsink.NewEncoded(gc, "out", func(k string) (*message.Message, error) {
					return message.NewMessage(k, []byte(k)), nil
				}, wmsink.WithBatchSize(3)), nil
			},
			Record: func(k string) string { return k },
			Visible: func(context.Context) ([]string, error) {
				mu.Lock()
				defer mu.Unlock()
				return append([]string(nil), got...), nil
			},
		}
	})
}
