package watermill_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// Benchmarks of the RocketMQ Pub/Sub on the embedded broker (in-process,
// loopback, async flush) next to watermill's in-memory GoChannel, paired by
// name (.../impl=runnel-rocketmq and .../impl=gochannel) for
// `benchstat -col /impl`. Each reports msg/s besides ns/op.

const benchPayload = 100

func benchTopic(b *testing.B) string {
	return "bench-" + strconv.Itoa(b.N) + "-" + watermill.NewShortUUID()
}

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}

func newGoChannel(b *testing.B, persistent bool) *gochannel.GoChannel {
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: persistent, OutputChannelBuffer: 1024}, watermill.NopLogger{})
	b.Cleanup(func() { _ = ps.Close() })
	return ps
}

// BenchmarkBenchSubscriber runs watermill's tests.BenchSubscriber: one
// goroutine publishes b.N messages one by one while the subscriber reads and
// acks them (end-to-end throughput).
func BenchmarkBenchSubscriber(b *testing.B) {
	e := newEnv(b)
	pc := pubSubConfig{queues: 4}
	b.Run("impl=runnel-rocketmq", func(b *testing.B) {
		b.ReportAllocs()
		tests.BenchSubscriber(b, func(int) (message.Publisher, message.Subscriber) {
			return newPublisher(b, e.nsAddr, pc), newSubscriber(b, e.nsAddr, pc)
		})
		reportRate(b)
	})
	b.Run("impl=gochannel", func(b *testing.B) {
		b.ReportAllocs()
		tests.BenchSubscriber(b, func(int) (message.Publisher, message.Subscriber) {
			ps := newGoChannel(b, false)
			return ps, ps
		})
		reportRate(b)
	})
}

// drain acks every message of ch until it closes.
func drain(ch <-chan *message.Message, wg *sync.WaitGroup) {
	defer wg.Done()
	for msg := range ch {
		msg.Ack()
	}
}

// BenchmarkPublish: Publish of one 100-byte message at a time, with a
// subscriber draining the topic.
func BenchmarkPublish(b *testing.B) {
	e := newEnv(b)
	pc := pubSubConfig{queues: 4}
	run := func(b *testing.B, pub message.Publisher, sub message.Subscriber) {
		topic := benchTopic(b)
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go drain(ch, &wg)
		defer func() { cancel(); wg.Wait() }()
		payload := make([]byte, benchPayload)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), payload)); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b)
	}
	b.Run("impl=runnel-rocketmq", func(b *testing.B) {
		run(b, newPublisher(b, e.nsAddr, pc), newSubscriber(b, e.nsAddr, pc))
	})
	b.Run("impl=gochannel", func(b *testing.B) {
		ps := newGoChannel(b, false)
		run(b, ps, ps)
	})
}

// BenchmarkSubscribe: b.N messages stored before the timer starts are read
// and acked by a new subscriber (joining the group is timed too).
func BenchmarkSubscribe(b *testing.B) {
	e := newEnv(b)
	pc := pubSubConfig{queues: 4}
	run := func(b *testing.B, pub message.Publisher, sub message.Subscriber) {
		topic := benchTopic(b)
		if si, ok := sub.(message.SubscribeInitializer); ok {
			if err := si.SubscribeInitialize(topic); err != nil {
				b.Fatal(err)
			}
		}
		payload := make([]byte, benchPayload)
		var wg sync.WaitGroup
		const publishers = 16
		for p := range publishers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := p; i < b.N; i += publishers {
					if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), payload)); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.ReportAllocs()
		b.ResetTimer()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			b.Fatal(err)
		}
		for range b.N {
			msg, ok := <-ch
			if !ok {
				b.Fatal("channel closed")
			}
			msg.Ack()
		}
		b.StopTimer()
		reportRate(b)
	}
	b.Run("impl=runnel-rocketmq", func(b *testing.B) {
		run(b, newPublisher(b, e.nsAddr, pc), newSubscriber(b, e.nsAddr, pc))
	})
	b.Run("impl=gochannel", func(b *testing.B) {
		ps := newGoChannel(b, true)
		run(b, ps, ps)
	})
}
