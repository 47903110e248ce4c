package interop

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Client benchmarks: runnel's client (transport/client, impl=runnel) and
// the official Go client (impl=official) against one embedded broker in
// the same process and run, so that `benchstat -col /impl` pairs them. The
// broker flushes asynchronously (FlushAsync): the store's fsync is off the
// send path, so the clients are what differs.
//
// One op is one message. allocs/op and B/op count the whole process: the
// client AND the in-process broker. impl=raw rows run the same load with a
// bare remoting.Conn and hand-encoded requests (SEND_MESSAGE_V2 / PULL, as
// runnel's client sends them); their allocations are the broker's plus the
// few of a bare request/response on the client side, so
// allocs(impl) − allocs(raw) estimates what each client adds per message
// (a slight underestimate: the raw transport's own client-side allocations
// are left in the raw figure).

// BenchmarkClientProduce measures sends of 128 B and 1 KiB bodies with 1
// send in flight (a synchronous send loop) and with 64 (asynchronous sends
// bounded by a semaphore), to a topic of 8 queues.
func BenchmarkClientProduce(b *testing.B) {
	env := startBrokerEnv(b, broker.WithFlushMode(broker.FlushAsync))
	rc := newRunnelClient(b, env)
	rp := newRunnelProducer(b, rc, uniqueName("benchRP"), client.WithRetries(0))
	op := newProducer(b, env, producer.WithRetry(0))
	for _, size := range benchSizes {
		for _, inflight := range []int{1, benchInFlight} {
			b.Run(fmt.Sprintf("size=%s/inflight=%d", size.name, inflight), func(b *testing.B) {
				topic := benchTopic(b, env, "BenchClientProduce")
				body := make([]byte, size.n)
				for i := range body {
					body[i] = byte('a' + i%26)
				}
				b.Run("impl=runnel", func(b *testing.B) { produceClientRunnel(b, rp, topic, body, inflight) })
				b.Run("impl=official", func(b *testing.B) { produceClientOfficial(b, op, topic, body, inflight) })
				b.Run("impl=raw", func(b *testing.B) { produceClientRaw(b, env, topic, body, inflight) })
			})
		}
	}
}

// sendWindow runs b.N sends with at most inflight of them outstanding:
// send(i, done) starts send i and calls done(err) exactly once when it
// completed. It reports msgs/s.
func sendWindow(b *testing.B, inflight int, send func(i int, done func(error))) {
	b.Helper()
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	done := func(err error) {
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
		<-sem
		wg.Done()
	}
	m := startMeasure(b)
	for i := range b.N {
		sem <- struct{}{}
		wg.Add(1)
		send(i, done)
	}
	wg.Wait()
	m.stop(b, int64(b.N))
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sends failed, first: %v", n, firstErr.Load())
	}
}

// measure reports msgs/s, allocs/msg (unrounded, unlike allocs/op, which
// rounds to an integer) and cpu-us/msg of a benchmark loop. cpu-us/msg is
// the process's CPU time (client and broker together) per message: steadier
// than msgs/s on a shared machine, where the wall-clock figures of a
// one-in-flight loop are mostly scheduling delay.
type measure struct {
	start   time.Time
	cpu     time.Duration
	mallocs uint64
}

func startMeasure(b *testing.B) measure {
	b.ReportAllocs()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ResetTimer()
	return measure{start: time.Now(), cpu: cputime.Process(), mallocs: ms.Mallocs}
}

func (m measure) stop(b *testing.B, msgs int64) {
	elapsed := time.Since(m.start)
	cpu := cputime.Process() - m.cpu
	b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(msgs)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(ms.Mallocs-m.mallocs)/float64(msgs), "allocs/msg")
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(msgs), "cpu-us/msg")
}

func produceClientRunnel(b *testing.B, p *client.Producer, topic string, body []byte, inflight int) {
	ctx := context.Background()
	// warm the route and connection
	if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: body}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	if inflight == 1 {
		sendWindow(b, 1, func(_ int, done func(error)) {
			_, err := p.Send(ctx, &client.Message{Topic: topic, Body: body})
			done(err)
		})
		return
	}
	sendWindow(b, inflight, func(_ int, done func(error)) {
		p.SendAsync(ctx, func(_ client.SendResult, err error) { done(err) }, &client.Message{Topic: topic, Body: body})
	})
}

func produceClientOfficial(b *testing.B, p rocketmq.Producer, topic string, body []byte, inflight int) {
	ctx := context.Background()
	if _, err := p.SendSync(ctx, primitive.NewMessage(topic, body)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	check := func(res *primitive.SendResult, err error) error {
		if err == nil && res.Status != primitive.SendOK {
			err = fmt.Errorf("status %v", res.Status)
		}
		return err
	}
	if inflight == 1 {
		sendWindow(b, 1, func(_ int, done func(error)) {
			done(check(p.SendSync(ctx, primitive.NewMessage(topic, body))))
		})
		return
	}
	sendWindow(b, inflight, func(_ int, done func(error)) {
		err := p.SendAsync(ctx, func(_ context.Context, res *primitive.SendResult, err error) {
			done(check(res, err))
		}, primitive.NewMessage(topic, body))
		if err != nil {
			done(err)
		}
	})
}

// rawSendReq is the SEND_MESSAGE_V2 request runnel's producer sends for a
// plain message, with a fixed UNIQ_KEY.
func rawSendReq(topic string, queue int32, body []byte, props string) *protocol.Command {
	req := protocol.NewRequest(protocol.ReqSendMessageV2)
	h := protocol.SendMessageRequestHeaderV2{
		ProducerGroup: "benchRaw", Topic: topic, DefaultTopic: client.DefaultTopic, DefaultTopicQueueNums: 4,
		QueueID: queue, BornTimestamp: time.Now().UnixMilli(), Properties: props,
		ReconsumeTimes: protocol.Some[int32](0), UnitMode: protocol.Some(false), BrokerName: broker0,
	}
	h.Encode(req)
	req.Body = body
	return req
}

func produceClientRaw(b *testing.B, env *brokerEnv, topic string, body []byte, inflight int) {
	conn := dialTB(b, env.addr)
	props := string(protocol.AppendProperty(protocol.AppendProperty(nil, protocol.PropUniqKey,
		"7F000001000000000000000000000001"), protocol.PropWaitStoreMsgOK, "true"))
	ctx := context.Background()
	check := func(resp *protocol.Command, err error) error {
		if err == nil && resp.Code != protocol.ResSuccess {
			err = fmt.Errorf("code %d %s", resp.Code, resp.Remark)
		}
		return err
	}
	b.SetBytes(int64(len(body)))
	sendWindow(b, inflight, func(i int, done func(error)) {
		req := rawSendReq(topic, int32(i%8), body, props)
		if inflight == 1 {
			done(check(conn.Invoke(ctx, req)))
			return
		}
		conn.InvokeAsync(ctx, req, func(resp *protocol.Command, err error) { done(check(resp, err)) })
	})
}

// BenchmarkClientPull drains a preloaded queue (20000 messages of 128 B)
// from offset 0, 32 messages per pull, wrapping around: runnel's
// Client.Pull loop, the official lite pull consumer's PullFrom, and a raw
// PULL_MESSAGE loop on a remoting.Conn.
func BenchmarkClientPull(b *testing.B) {
	env, topic, _ := preloadPullQueue(b, "BenchClientPull")
	ctx := context.Background()

	b.Run("impl=runnel", func(b *testing.B) {
		c := newRunnelClient(b, env)
		q := protocol.MessageQueue{Topic: topic, BrokerName: broker0, QueueID: 0}
		pullLoop(b, pullPreload, func(off int64) int {
			res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 32, Group: "benchPullR"})
			if err != nil || res.Status != client.PullFound {
				b.Fatalf("Pull @%d: %v %v", off, res, err)
			}
			return len(res.Messages)
		})
	})
	b.Run("impl=official", func(b *testing.B) {
		pc := newLitePull(b, env, uniqueName("benchPullO"))
		mq := &primitive.MessageQueue{Topic: topic, BrokerName: broker0, QueueId: 0}
		if err := pc.Assign(topic, []*primitive.MessageQueue{mq}); err != nil {
			b.Fatal(err)
		}
		if err := pc.Start(); err != nil {
			b.Fatal(err)
		}
		pullLoop(b, pullPreload, func(off int64) int {
			res, err := pc.PullFrom(ctx, mq, off, 32)
			if err != nil || res.Status != primitive.PullFound {
				b.Fatalf("PullFrom @%d: %v %v", off, res, err)
			}
			return len(res.GetMessageExts())
		})
	})
	b.Run("impl=raw", func(b *testing.B) {
		rconn := dialTB(b, env.addr)
		pullLoop(b, pullPreload, func(off int64) int { return rawPull(b, rconn, topic, off) })
	})
}

// pullLoop calls pull from offset 0 on, wrapping around at preload, until
// b.N messages were read, and reports msgs/s.
func pullLoop(b *testing.B, preload int64, pull func(off int64) int) {
	b.Helper()
	pull(0) // warm the route and connection
	b.SetBytes(128)
	m := startMeasure(b)
	var off int64
	got := 0
	for got < b.N {
		n := pull(off)
		got += n
		if off += int64(n); off >= preload {
			off = 0
		}
	}
	m.stop(b, int64(got))
}

// rawPull pulls up to 32 messages of queue 0 from off and decodes them.
func rawPull(b *testing.B, conn *remoting.Conn, topic string, off int64) int {
	req := protocol.NewRequest(protocol.ReqPullMessage)
	h := protocol.PullMessageRequestHeader{
		ConsumerGroup: "benchPullRaw", Topic: topic, QueueID: 0, QueueOffset: off,
		MaxMsgNums: 32, Subscription: "*", ExpressionType: protocol.ExpressionTypeTag,
	}
	h.Encode(req)
	resp, err := conn.Invoke(context.Background(), req)
	if err != nil || resp.Code != protocol.ResSuccess {
		b.Fatalf("pull @%d: %v %v", off, resp, err)
	}
	n := 0
	if err := protocol.DecodeRecords(resp.Body, func(*protocol.MessageExt) bool { n++; return true }); err != nil {
		b.Fatal(err)
	}
	return n
}
