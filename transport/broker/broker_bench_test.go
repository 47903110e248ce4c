package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// BenchmarkBrokerSend measures SEND_MESSAGE round trips over real TCP into
// a real Pebble store, from many goroutines spread over several
// connections. Allocations include the client side of the round trip.
func BenchmarkBrokerSend(b *testing.B) {
	for _, mode := range []struct {
		name string
		m    FlushMode
	}{{"sync", FlushSync}, {"async", FlushAsync}} {
		for _, size := range []int{128, 1024} {
			b.Run(mode.name+"/"+itoa(size)+"B", func(b *testing.B) {
				br := startBroker(b, WithFlushMode(mode.m))
				const nConns = 4
				conns := make([]*remoting.Conn, nConns)
				for i := range conns {
					conns[i] = dial(b, br.Addr())
				}
				body := make([]byte, size)
				p := props("TAGS", "TagA")
				send(b, conns[0], "BenchSend", 0, body, p) // create the topic
				var next atomic.Int64
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.SetParallelism(16)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					c := conns[next.Add(1)%nConns]
					ctx := context.Background()
					for pb.Next() {
						resp, err := c.Invoke(ctx, sendReq("BenchSend", -1, body, p))
						if err != nil || resp.Code != protocol.ResSuccess {
							b.Errorf("send: %v %v", err, resp)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}

// BenchmarkBrokerSendPipelined measures SEND_MESSAGE with 64 requests in
// flight on one connection (InvokeAsync), the load shape of a pipelining
// producer, per flush mode and body size (128 B, 1 KiB). Besides msgs/s it reports the process CPU time
// per message (client and broker together; steadier than msgs/s on a shared
// machine) the messages per store commit round, and the messages per WAL fsync
// (group commit) in sync mode.
func BenchmarkBrokerSendPipelined(b *testing.B) {
	for _, mode := range []struct {
		name string
		m    FlushMode
	}{{"sync", FlushSync}, {"async", FlushAsync}} {
		for _, size := range []int{128, 1024} {
			for _, shape := range []string{"tags", "uniq"} {
				b.Run(fmt.Sprintf("%s/%dB/props=%s", mode.name, size, shape), func(b *testing.B) {
					benchSendPipelined(b, mode.m, size, shape == "uniq")
				})
			}
		}
	}
}

// benchSendPipelined is BenchmarkBrokerSendPipelined for one flush mode;
// uniq makes every message carry its own UNIQ_KEY and nothing else, as the
// official Go producer's do (so the broker adds only CLUSTER), instead of
// TAGS (the broker adds UNIQ_KEY and CLUSTER).
func benchSendPipelined(b *testing.B, mode FlushMode, size int, uniq bool) {
	br := startBroker(b, WithFlushMode(mode))
	c := dial(b, br.Addr())
	body := make([]byte, size)
	p := props("TAGS", "TagA")
	send(b, c, "BenchPipe", 0, body, p) // create the topic
	// A UNIQ_KEY of the official client's shape: 32 hex digits, the last
	// 8 a counter.
	var uniqBuf []byte
	if uniq {
		uniqBuf = []byte(props(protocol.PropUniqKey, "0A0000090001000000000000DEAD0000"))
	}
	const inFlight = 64
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	ctx := context.Background()
	syncs0, rounds0 := br.store.Syncs(), br.store.Rounds()
	cpu0 := cputime.Process()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		sem <- struct{}{}
		wg.Add(1)
		if uniq {
			n := len(uniqBuf) - 1 // before the separator
			for j, v := 0, uint32(i); j < 8; j, v = j+1, v>>4 {
				uniqBuf[n-1-j] = "0123456789ABCDEF"[v&15]
			}
			p = string(uniqBuf)
		}
		c.InvokeAsync(ctx, sendReq("BenchPipe", int32(i%4), body, p), func(resp *protocol.Command, err error) {
			if err != nil || resp.Code != protocol.ResSuccess {
				failed.Add(1)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sends failed", n)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/msg")
	if n := br.store.Rounds() - rounds0; n > 0 {
		b.ReportMetric(float64(b.N)/float64(n), "msgs/commit")
	}
	if mode == FlushSync {
		if n := br.store.Syncs() - syncs0; n > 0 {
			b.ReportMetric(float64(b.N)/float64(n), "msgs/fsync")
		}
	}
}

// BenchmarkBrokerPull measures PULL_MESSAGE round trips returning 32
// messages of 128 bytes each from a pre-filled queue.
func BenchmarkBrokerPull(b *testing.B) {
	br := startBroker(b, WithFlushMode(FlushAsync))
	c := dial(b, br.Addr())
	const total, batch = 4096, 32
	body := make([]byte, 128)
	var items []byte
	for range batch {
		items, _ = protocol.AppendBatchItem(items, 0, body, props("TAGS", "TagA"))
	}
	for range total / batch {
		req := protocol.NewRequest(protocol.ReqSendBatchMessage)
		(&protocol.SendMessageRequestHeaderV2{ProducerGroup: "pg", Topic: "BenchPull", DefaultTopic: topicDefault,
			DefaultTopicQueueNums: 1, QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Batch: protocol.Some(true)}).Encode(req)
		req.Body = items
		if resp := invoke(b, c, req); resp.Code != protocol.ResSuccess {
			b.Fatalf("fill: %d %s", resp.Code, resp.Remark)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := int64(i*batch) % total
		resp, err := c.Invoke(ctx, pullRequest(pullArgs{topic: "BenchPull", offset: off, max: batch}))
		if err != nil || resp.Code != protocol.ResSuccess {
			b.Fatalf("pull: %v %v", err, resp)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
}
