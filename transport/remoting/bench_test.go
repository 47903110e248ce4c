package remoting

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func benchServer(b *testing.B) *Conn {
	s, addr := newTestServer(b)
	s.Handle(500, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.SetExt("queueOffset", "42")
		return resp, nil
	}))
	return dialT(b, addr)
}

func benchRequest() *protocol.Command {
	req := protocol.NewRequest(500)
	req.SetExt("topic", "TopicTest")
	req.SetExt("queueId", "1")
	req.SetExt("producerGroup", "pg")
	req.Body = make([]byte, 128)
	return req
}

// BenchmarkInvokeSync measures one synchronous round trip over loopback
// (client encode, write, server decode, processor, response, client decode).
func BenchmarkInvokeSync(b *testing.B) {
	c := benchServer(b)
	req := benchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Invoke(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInvokeParallel measures round trips from GOMAXPROCS goroutines
// sharing one Conn (pipelining and write coalescing): 16 goroutines per
// GOMAXPROCS.
func BenchmarkInvokeParallel(b *testing.B) {
	c := benchServer(b)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := benchRequest()
		for pb.Next() {
			if _, err := c.Invoke(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkInvokeAsyncTimeout measures async round trips with 64 in flight
// and a per-call timeout, enforced by a context.WithTimeout per call
// (impl=ctx) or by the Conn's own sweep timer (impl=conn).
func BenchmarkInvokeAsyncTimeout(b *testing.B) {
	for _, impl := range []string{"ctx", "conn"} {
		b.Run("impl="+impl, func(b *testing.B) {
			c := benchServer(b)
			sem := make(chan struct{}, 64)
			var wg sync.WaitGroup
			cb := func(resp *protocol.Command, err error) {
				if err != nil {
					b.Error(err)
				}
				<-sem
				wg.Done()
			}
			b.ReportAllocs()
			for b.Loop() {
				sem <- struct{}{}
				wg.Add(1)
				req := benchRequest()
				if impl == "conn" {
					c.InvokeAsyncTimeout(context.Background(), req, 3*time.Second, cb)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				c.InvokeAsync(ctx, req, func(resp *protocol.Command, err error) {
					cancel()
					cb(resp, err)
				})
			}
			wg.Wait()
		})
	}
}
