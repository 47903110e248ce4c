package remoting

import (
	"context"
	"testing"

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
