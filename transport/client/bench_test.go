package client

import (
	"context"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Benchmarks run against the embedded broker over loopback (FlushAsync, so
// that the client, not fsync, is measured). One op is one message:
// allocs/op is allocations per message on the client and broker together
// (they share the process).

func benchEnv(b *testing.B, topic string, queues int) (*coreEnv, *Client) {
	b.Helper()
	e := newCoreEnvOpts(b, nil, []broker.Option{broker.WithFlushMode(broker.FlushAsync)})
	c := e.client(WithRequestTimeout(10 * time.Second))
	e.createTopic(c, topic, queues)
	return e, c
}

func BenchmarkProduce(b *testing.B) {
	_, c := benchEnv(b, "BenchProduceT", 4)
	p, err := NewProducer(c, "bench-pg")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for _, size := range []int{128, 1024} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte('a' + i%26)
		}
		name := map[int]string{128: "128B", 1024: "1KiB"}[size]
		b.Run("sync-"+name, func(b *testing.B) {
			m := &Message{Topic: "BenchProduceT", Body: body, Tags: "bench"}
			b.ReportAllocs()
			b.SetBytes(int64(size))
			start := time.Now()
			for b.Loop() {
				if _, err := p.Send(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
		b.Run("async64-"+name, func(b *testing.B) {
			m := &Message{Topic: "BenchProduceT", Body: body, Tags: "bench"}
			sem := make(chan struct{}, 64)
			errs := make(chan error, 1)
			cb := func(_ SendResult, err error) {
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
				<-sem
			}
			b.ReportAllocs()
			b.SetBytes(int64(size))
			start := time.Now()
			for b.Loop() {
				sem <- struct{}{}
				p.SendAsync(ctx, cb, m)
			}
			for range cap(sem) {
				sem <- struct{}{}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
		})
	}
}

func BenchmarkPull(b *testing.B) {
	const preload = 20000
	_, c := benchEnv(b, "BenchPullT", 1)
	r, err := c.Route(context.Background(), "BenchPullT")
	if err != nil {
		b.Fatal(err)
	}
	q := r.PublishQueues()[0]
	p, err := NewProducer(c, "bench-pg")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	body := make([]byte, 128)
	batch := make([]*Message, 100)
	for i := range batch {
		batch[i] = &Message{Topic: "BenchPullT", Body: body, Queue: &q}
	}
	for range preload / len(batch) {
		if _, err := p.Send(ctx, batch...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.SetBytes(128)
	start := time.Now()
	off, n := int64(0), 0
	for n < b.N {
		res, err := c.Pull(ctx, PullRequest{Queue: q, Offset: off, Group: "bench-g", MaxMsgs: 32})
		if err != nil {
			b.Fatal(err)
		}
		switch res.Status {
		case PullFound:
			n += len(res.Messages)
			off = res.NextBeginOffset
		case PullNoNewMsg, PullOffsetIllegal:
			off = 0 // drained: read the queue again
		default:
			b.Fatalf("pull status %v", res.Status)
		}
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
	_ = protocol.MasterID
}
