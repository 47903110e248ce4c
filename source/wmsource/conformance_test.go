package wmsource_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/runnel-dev/runnel/source/sourcetest"
	"github.com/runnel-dev/runnel/source/wmsource"
)

// TestConformance runs the watermill source through the source contract
// (sourcetest) over a persistent GoChannel. The source cannot seek: a
// split reopened at a restored offset gets whatever the subscriber
// redelivers (here, every message GoChannel persisted), so it declares
// AtLeastOnce; everything else is checked as for any source.
func TestConformance(t *testing.T) {
	sourcetest.Run(t, sourcetest.Features{AtLeastOnce: true}, func(t *testing.T, n int) sourcetest.Instance[*message.Message] {
		gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
		t.Cleanup(func() { _ = gc.Close() })
		seq := 0
		publish := func(n int) ([]string, error) {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("m%03d", seq)
				seq++
				if err := gc.Publish("in", message.NewMessage(keys[i], []byte(keys[i]))); err != nil {
					return nil, err
				}
			}
			return keys, nil
		}
		keys, err := publish(n)
		if err != nil {
			t.Fatal(err)
		}
		return sourcetest.Instance[*message.Message]{
			Source:  wmsource.New(gc, "in"),
			Key:     func(m *message.Message) string { return m.UUID },
			Records: keys,
			Produce: func(_ context.Context, n int) ([]string, error) { return publish(n) },
		}
	})
}
