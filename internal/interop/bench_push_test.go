package interop

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// pushPreload is the backlog BenchmarkClientPush consumes per op: 128-byte
// messages over pushQueues queues.
const (
	pushPreload = 20000
	pushQueues  = 4
)

// BenchmarkClientPush measures push consumers draining a preloaded
// backlog (pushPreload messages of 128 B on 4 queues) on one embedded
// broker (async flush), same run: runnel's PushConsumer (impl=runnel) and
// the official Go client's push consumer (impl=official), both with their
// defaults (20 consume goroutines, pulls of 32, one message per handler
// call), concurrent and orderly (official: WithConsumerOrder). One op is
// one drain by a new group from the first offset, timed from Start until
// the last message was handled (start-up included, shutdown not);
// msgs/s and cpu-us/msg (the process's CPU, client and broker together,
// per message) are over those phases only.
func BenchmarkClientPush(b *testing.B) {
	env := startBrokerEnv(b, broker.WithFlushMode(broker.FlushAsync))
	topic := uniqueName("BenchPush")
	createTopic(b, env, topic, pushQueues)
	preloadQueues(b, env, topic)
	for _, mode := range []string{"concurrent", "orderly"} {
		b.Run("mode="+mode, func(b *testing.B) {
			b.Run("impl=runnel", func(b *testing.B) {
				c := newRunnelClient(b, env)
				drainLoop(b, func(group string, done func(n int)) func() {
					return startRunnelPush(b, c, group, topic, mode == "orderly", done)
				})
			})
			b.Run("impl=official", func(b *testing.B) {
				drainLoop(b, func(group string, done func(n int)) func() {
					return startOfficialPush(b, env, group, topic, mode == "orderly", done)
				})
			})
		})
	}
}

// preloadQueues stores pushPreload 128-byte messages round robin over the
// topic's queues.
func preloadQueues(b *testing.B, env *brokerEnv, topic string) {
	b.Helper()
	conn := dialTB(b, env.addr)
	body := make([]byte, 128)
	var wg sync.WaitGroup
	sem := make(chan struct{}, benchInFlight)
	for i := range pushPreload {
		sem <- struct{}{}
		wg.Add(1)
		conn.InvokeAsync(context.Background(), durableSendReq(topic, int32(i%pushQueues), body, "p"), func(resp *protocol.Command, err error) {
			if err != nil || resp.Code != protocol.ResSuccess {
				b.Errorf("preload: %v %v", resp, err)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
}

// drainLoop runs b.N drains: start(group, done) starts a consumer of a
// new group whose handler calls done(n) per n messages and returns its
// stop; the drain ends when pushPreload messages were handled.
func drainLoop(b *testing.B, start func(group string, done func(n int)) func()) {
	b.Helper()
	defer labelClient()()
	b.ReportAllocs()
	var wall, cpu time.Duration
	b.ResetTimer()
	for range b.N {
		var got atomic.Int64
		finished := make(chan struct{})
		var once sync.Once
		done := func(n int) {
			if got.Add(int64(n)) >= pushPreload {
				once.Do(func() { close(finished) })
			}
		}
		t0, c0 := time.Now(), cputime.Process()
		stop := start(uniqueName("benchPush"), done)
		select {
		case <-finished:
		case <-time.After(2 * time.Minute):
			b.Fatalf("drained %d of %d messages in 2 min", got.Load(), pushPreload)
		}
		wall += time.Since(t0)
		cpu += cputime.Process() - c0
		b.StopTimer()
		stop()
		b.StartTimer()
	}
	b.StopTimer()
	msgs := float64(b.N) * pushPreload
	b.ReportMetric(msgs/wall.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/msgs, "cpu-us/msg")
}

func startRunnelPush(b *testing.B, c *client.Client, group, topic string, orderly bool, done func(int)) func() {
	b.Helper()
	var h client.Handler = client.ConcurrentHandler(func(_ context.Context, msgs []*client.ConsumedMessage) error {
		done(len(msgs))
		return nil
	})
	if orderly {
		h = client.OrderlyHandler(func(_ context.Context, msgs []*client.ConsumedMessage) error {
			done(len(msgs))
			return nil
		})
	}
	pc, err := client.NewPushConsumer(c, group, h, client.WithConsumeFrom(client.ConsumeFromFirst))
	if err != nil {
		b.Fatal(err)
	}
	if err := pc.Subscribe(topic, client.ByTag("*")); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pc.Shutdown(ctx); err != nil {
			b.Errorf("runnel push consumer shutdown: %v", err)
		}
	}
}

func startOfficialPush(b *testing.B, env *brokerEnv, group, topic string, orderly bool, done func(int)) func() {
	b.Helper()
	var opts []consumer.Option
	if orderly {
		opts = append(opts, consumer.WithConsumerOrder(true))
	}
	pc := newPushConsumer(b, env, group, uniqueInstance("benchPush"), opts...)
	err := pc.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		done(len(msgs))
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		b.Fatal(err)
	}
	return func() {
		if err := pc.Shutdown(); err != nil {
			b.Errorf("official push consumer shutdown: %v", err)
		}
	}
}
