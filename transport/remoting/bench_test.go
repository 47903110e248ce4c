package remoting

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func benchServer(b *testing.B) *Conn {
	return benchServerWith(b, false)
}

// benchServerWith registers the benchmark processor with Handle, or with
// HandleInline when inline is set.
func benchServerWith(b *testing.B, inline bool) *Conn {
	s, addr := newTestServer(b)
	p := ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.SetExt("queueOffset", "42")
		return resp, nil
	})
	if inline {
		s.HandleInline(500, p)
	} else {
		s.Handle(500, p)
	}
	return dialT(b, addr)
}

// BenchmarkServeInline measures round trips with the processor on a
// handler goroutine (handler=worker) or on the reader (handler=inline),
// one at a time (inflight=1) and with 64 async calls in flight.
func BenchmarkServeInline(b *testing.B) {
	for _, inflight := range []int{1, 64} {
		for _, h := range []string{"worker", "inline"} {
			b.Run(fmt.Sprintf("inflight=%d/handler=%s", inflight, h), func(b *testing.B) {
				c := benchServerWith(b, h == "inline")
				sem := make(chan struct{}, inflight)
				var wg sync.WaitGroup
				cb := func(resp *protocol.Command, err error) {
					if err != nil {
						b.Error(err)
					}
					<-sem
					wg.Done()
				}
				ctx := context.Background()
				b.ReportAllocs()
				cpu0 := cputime.Process()
				for b.Loop() {
					sem <- struct{}{}
					wg.Add(1)
					c.InvokeAsync(ctx, benchRequest(), cb)
				}
				wg.Wait()
				reportCPU(b, cpu0)
			})
		}
	}
}

// reportCPU reports the process CPU time (client and server together) per
// round trip since cpu0: steadier than ns/op on a shared machine.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/op")
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
	benchInvokeLoop(b, benchServer(b))
}

// benchInvokeLoop measures sync round trips of benchRequest on c, one at
// a time, reporting allocations and CPU per op.
func benchInvokeLoop(b *testing.B, c *Conn) {
	req := benchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		if _, err := c.Invoke(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu0)
}

// BenchmarkInvokeParallel measures round trips from GOMAXPROCS goroutines
// sharing one Conn (pipelining and write coalescing): 16 goroutines per
// GOMAXPROCS.
func BenchmarkInvokeParallel(b *testing.B) {
	c := benchServer(b)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ReportAllocs()
	cpu0 := cputime.Process()
	b.RunParallel(func(pb *testing.PB) {
		req := benchRequest()
		for pb.Next() {
			if _, err := c.Invoke(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportCPU(b, cpu0)
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
			cpu0 := cputime.Process()
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
			reportCPU(b, cpu0)
		})
	}
}

// withoutSock turns off direct writes and read-buffer release (noSock).
func withoutSock() CommonOption { return commonOpt(func(c *connConfig) { c.noSock = true }) }

// BenchmarkRoundTripDirect compares one synchronous round trip at a time
// (an inline processor, as the broker's sends) with direct writes on both
// sides (direct=on: the caller and the processor write their frames) and
// without (direct=off: every frame handed to a writer goroutine), in the
// same run.
func BenchmarkRoundTripDirect(b *testing.B) {
	for _, direct := range []bool{true, false} {
		b.Run(fmt.Sprintf("direct=%v", direct), func(b *testing.B) {
			var opts []ServerOption
			var copts []Option
			if !direct {
				opts, copts = append(opts, withoutSock()), append(copts, withoutSock())
			}
			s, addr := newTestServer(b, opts...)
			s.HandleInline(500, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
				resp := protocol.NewResponse(rc.Request(), 0, "")
				resp.SetExt("queueOffset", "42")
				return resp, nil
			}))
			benchInvokeLoop(b, dialT(b, addr, copts...))
		})
	}
}

// BenchmarkRoundTripFloor sets one synchronous round trip of a Conn (an
// inline processor answering a 128-byte request, as BenchmarkRoundTripDirect
// direct=true: impl=conn) beside the floor of loopback TCP on the machine
// in the same run: a plain Go echo of 128 bytes where the caller reads its
// reply (impl=echo), and the same echo with the replies read by a reader
// goroutine and handed to the caller through a channel (impl=echo-hop, the
// shape of a Conn's client side). Compare with `benchstat -col /impl`;
// cpu-us/op is the process's CPU (both ends) per round trip.
//
// impl=conn writes JSON headers (and is answered in JSON); impl=conn-rmq
// writes ROCKETMQ binary headers, as runnel's client does by default, and
// is answered in them. Both let the caller read its own response
// (WithCallerReads, the default); impl=conn-rmq-hop is conn-rmq with the
// responses handed over by the Conn's reader goroutine instead.
func BenchmarkRoundTripFloor(b *testing.B) {
	for _, row := range []struct {
		name        string
		st          protocol.SerializeType
		callerReads bool
	}{
		{"impl=conn", protocol.SerializeJSON, true},
		{"impl=conn-rmq", protocol.SerializeRocketMQ, true},
		{"impl=conn-rmq-hop", protocol.SerializeRocketMQ, false},
	} {
		b.Run(row.name, func(b *testing.B) {
			s, addr := newTestServer(b)
			s.HandleInline(500, ProcessorFunc(func(ctx context.Context, rc *RequestCtx) (*protocol.Command, error) {
				resp := protocol.NewResponse(rc.Request(), 0, "")
				resp.SetExt("queueOffset", "42")
				return resp, nil
			}))
			benchInvokeLoop(b, dialT(b, addr, WithSerializeType(row.st), WithCallerReads(row.callerReads)))
		})
	}
	for _, hop := range []bool{false, true} {
		name := "impl=echo"
		if hop {
			name = "impl=echo-hop"
		}
		b.Run(name, func(b *testing.B) { benchEcho(b, hop) })
	}
}

// benchEcho measures round trips of 128 bytes over a plain loopback TCP
// echo (see BenchmarkRoundTripFloor).
func benchEcho(b *testing.B, hop bool) {
	const size = 128
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Add(1)
	go func() { // the echo server: joined by wg once the client closed
		defer wg.Done()
		sc, err := ln.Accept()
		if err != nil {
			return
		}
		defer sc.Close()
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(sc, buf); err != nil {
				return
			}
			if _, err := sc.Write(buf); err != nil {
				return
			}
		}
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	replies := make(chan []byte, 1)
	if hop {
		wg.Add(1)
		go func() { // the client's reader: ends when cc is closed
			defer wg.Done()
			bufs := [2][]byte{make([]byte, size), make([]byte, size)}
			for i := 0; ; i++ {
				buf := bufs[i%2]
				if _, err := io.ReadFull(cc, buf); err != nil {
					close(replies)
					return
				}
				replies <- buf
			}
		}()
	}
	buf := make([]byte, size)
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		if _, err := cc.Write(buf); err != nil {
			b.Fatal(err)
		}
		if hop {
			if _, ok := <-replies; !ok {
				b.Fatal("echo reader ended")
			}
			continue
		}
		if _, err := io.ReadFull(cc, buf); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu0)
}
