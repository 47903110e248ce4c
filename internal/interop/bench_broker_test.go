package interop

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Broker benchmarks: the embedded broker (in-process, 127.0.0.1, Pebble on
// a temporary dir) driven by the official Go client (impl=official) and by
// runnel's own remoting.Conn with typed headers (impl=runnel: the raw
// transport, the same request shape and window, without a high-level
// client) in the same run, so that `benchstat -col /impl` pairs them. Client
// and broker share the machine's cores.

// benchInFlight is the number of sends kept in flight.
const benchInFlight = 64

var benchFlushModes = []struct {
	name string
	mode broker.FlushMode
}{
	{"async", broker.FlushAsync},
	{"sync", broker.FlushSync},
}

var benchSizes = []struct {
	name string
	n    int
}{
	{"128", 128},
	{"1KiB", 1024},
}

// benchTopic creates a topic with 8 queues on env.
func benchTopic(b *testing.B, env *brokerEnv, prefix string) string {
	b.Helper()
	topic := uniqueName(prefix)
	createTopic(b, env, topic, 8)
	return topic
}

// BenchmarkBrokerProduce measures produce throughput with 64 sends in
// flight, per body size and flush mode, reported as msgs/s and process CPU
// per message (client and broker share the process: profile with
// -cpuprofile and split with `go tool pprof -tagfocus side=client`, see
// labelClient). impl=official is the official producer's SendAsync with 64
// callbacks outstanding, impl=official-sync 64 goroutines calling SendSync,
// impl=runnel runnel's raw remoting.Conn. impl=official-batch16 is the
// official producer's SendAsync of batches of 16 messages (one
// SEND_BATCH_MESSAGE each), 64 batches outstanding: msgs/s counts
// messages, so it shows what the broker takes from the official client when
// its per-request cost is shared.
func BenchmarkBrokerProduce(b *testing.B) {
	for _, size := range benchSizes {
		for _, fm := range benchFlushModes {
			b.Run("size="+size.name+"/flush="+fm.name, func(b *testing.B) {
				env := startBrokerEnv(b, broker.WithFlushMode(fm.mode))
				topic := benchTopic(b, env, "BenchProduce")
				body := make([]byte, size.n)
				b.Run("impl=runnel", func(b *testing.B) { produceRunnel(b, env, topic, body) })
				b.Run("impl=official", func(b *testing.B) { produceOfficial(b, env, topic, body) })
				b.Run("impl=official-sync", func(b *testing.B) { produceOfficialSync(b, env, topic, body) })
				b.Run("impl=official-batch16", func(b *testing.B) { produceOfficialBatch(b, env, topic, body, 16) })
			})
		}
	}
}

func produceOfficial(b *testing.B, env *brokerEnv, topic string, body []byte) {
	produceOfficialBatch(b, env, topic, body, 1) // one message: a plain SEND_MESSAGE
}

func produceRunnel(b *testing.B, env *brokerEnv, topic string, body []byte) {
	defer labelClient()()
	conn := dialTB(b, env.addr)
	sem := make(chan struct{}, benchInFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	// SEND_MESSAGE (10) with the header the official producer writes.
	h := protocol.SendMessageRequestHeader{
		ProducerGroup: "bench", Topic: topic, DefaultTopic: "TBW102", DefaultTopicQueueNums: 4,
		Properties:     string(protocol.AppendProperty(nil, protocol.PropWaitStoreMsgOK, "true")),
		ReconsumeTimes: protocol.Some[int32](0), UnitMode: protocol.Some(false),
		Batch: protocol.Some(false), MaxReconsumeTimes: protocol.Some[int32](0), BrokerName: broker0,
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Process()
	for i := range b.N {
		sem <- struct{}{}
		wg.Add(1)
		req := protocol.NewRequest(protocol.ReqSendMessage)
		hh := h
		hh.QueueID = int32(i % 8)
		hh.BornTimestamp = time.Now().UnixMilli()
		hh.Encode(req)
		req.Body = body
		conn.InvokeAsync(context.Background(), req, func(resp *protocol.Command, err error) {
			if err == nil && resp.Code != protocol.ResSuccess {
				err = fmt.Errorf("code %d %s", resp.Code, resp.Remark)
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cputime.Process()-cpu0
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sends failed, first: %v", n, firstErr.Load())
	}
	reportThroughput(b, elapsed, cpu)
}

// reportThroughput reports msgs/s and the process's CPU time per message
// (client and broker together, steadier than msgs/s on a shared machine).
func reportThroughput(b *testing.B, elapsed, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(b.N), "cpu-us/msg")
}

// labelClient labels the calling goroutine, and so the goroutines it
// starts (the official client's per-request and connection goroutines),
// side=client for CPU profiles: `go tool pprof -tagfocus side=client`
// splits the client's CPU from the broker's (runnel's own remoting.Conn
// relabels its reader and writer, so with impl=runnel the label covers the
// sending goroutine only). The returned func restores the old labels.
func labelClient() func() {
	old := context.Background()
	pprof.SetGoroutineLabels(pprof.WithLabels(old, pprof.Labels("side", "client")))
	return func() { pprof.SetGoroutineLabels(old) }
}

// pullPreload is the number of 128-byte messages preloadPullQueue stores.
const pullPreload = 20000

// preloadPullQueue starts a broker (async flush), creates a one-queue topic
// named after prefix and stores pullPreload 128-byte messages in it, with
// benchInFlight sends in flight on the returned connection.
func preloadPullQueue(b *testing.B, prefix string) (*brokerEnv, string, *remoting.Conn) {
	b.Helper()
	env := startBrokerEnv(b, broker.WithFlushMode(broker.FlushAsync))
	topic := uniqueName(prefix)
	createTopic(b, env, topic, 1)
	conn := dialTB(b, env.addr)
	body := make([]byte, 128)
	var wg sync.WaitGroup
	sem := make(chan struct{}, benchInFlight)
	for range pullPreload {
		sem <- struct{}{}
		wg.Add(1)
		conn.InvokeAsync(context.Background(), durableSendReq(topic, 0, body, "p"), func(resp *protocol.Command, err error) {
			if err != nil || resp.Code != protocol.ResSuccess {
				b.Errorf("preload: %v %v", resp, err)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
	return env, topic, conn
}

// BenchmarkBrokerPull drains a preloaded queue (128-byte messages, 32 per
// pull) from offset 0 on, wrapping around, reported as msgs/s.
func BenchmarkBrokerPull(b *testing.B) {
	env, topic, conn := preloadPullQueue(b, "BenchPull")
	b.Run("impl=runnel", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		var off int64
		for got := 0; got < b.N; {
			req := protocol.NewRequest(protocol.ReqPullMessage)
			h := protocol.PullMessageRequestHeader{
				ConsumerGroup: "benchPull", Topic: topic, QueueID: 0, QueueOffset: off,
				MaxMsgNums: 32, Subscription: "*", ExpressionType: protocol.ExpressionTypeTag,
			}
			h.Encode(req)
			resp, err := conn.Invoke(context.Background(), req)
			if err != nil || resp.Code != protocol.ResSuccess {
				b.Fatalf("pull @%d: %v %v", off, resp, err)
			}
			n := 0
			if err := protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool {
				n++
				return true
			}); err != nil {
				b.Fatal(err)
			}
			got += n
			if off += int64(n); off >= pullPreload {
				off = 0
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("impl=official", func(b *testing.B) {
		pc := newLitePull(b, env, uniqueName("benchPull"))
		mq := &primitive.MessageQueue{Topic: topic, BrokerName: broker0, QueueId: 0}
		if err := pc.Assign(topic, []*primitive.MessageQueue{mq}); err != nil {
			b.Fatal(err)
		}
		if err := pc.Start(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		var off int64
		for got := 0; got < b.N; {
			res, err := pc.PullFrom(context.Background(), mq, off, 32)
			if err != nil || res.Status != primitive.PullFound {
				b.Fatalf("PullFrom @%d: %v %v", off, res, err)
			}
			n := len(res.GetMessageExts())
			got += n
			if off += int64(n); off >= pullPreload {
				off = 0
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
}

// BenchmarkBrokerLatency measures produce→consume latency with long
// polling: one message at a time, sent once the previous one arrived, its
// send time in its body; the consumer's pull is parked at the broker when
// the send arrives. p50 and p99 in ms.
func BenchmarkBrokerLatency(b *testing.B) {
	env := startBrokerEnv(b, broker.WithFlushMode(broker.FlushAsync))
	b.Run("impl=runnel", func(b *testing.B) {
		topic := uniqueName("BenchLat")
		createTopic(b, env, topic, 1)
		pconn, cconn := dialTB(b, env.addr), dialTB(b, env.addr)
		got := make(chan time.Duration, 1)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			var off int64
			for ctx.Err() == nil {
				req := protocol.NewRequest(protocol.ReqPullMessage)
				h := protocol.PullMessageRequestHeader{
					ConsumerGroup: "benchLat", Topic: topic, QueueID: 0, QueueOffset: off, MaxMsgNums: 32,
					SysFlag: protocol.PullFlagSuspend, SuspendTimeoutMillis: 15000,
					Subscription: "*", ExpressionType: protocol.ExpressionTypeTag,
				}
				h.Encode(req)
				resp, err := cconn.Invoke(ctx, req)
				if err != nil {
					return
				}
				if resp.Code != protocol.ResSuccess {
					continue
				}
				now := time.Now()
				_ = protocol.DecodeRecords(resp.Body, func(m *protocol.MessageExt) bool {
					off = m.QueueOffset + 1
					got <- now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(m.Body))))
					return true
				})
			}
		}()
		defer func() { cancel(); wg.Wait() }()
		lat := make([]time.Duration, 0, b.N)
		body := make([]byte, 128)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			binary.BigEndian.PutUint64(body, uint64(time.Now().UnixNano()))
			resp, err := pconn.Invoke(context.Background(), durableSendReq(topic, 0, slices.Clone(body), "l"))
			if err != nil || resp.Code != protocol.ResSuccess {
				b.Fatalf("send: %v %v", resp, err)
			}
			select {
			case d := <-got:
				lat = append(lat, d)
			case <-time.After(10 * time.Second):
				b.Fatal("message not delivered in 10 s")
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
	b.Run("impl=official", func(b *testing.B) {
		topic := uniqueName("BenchLat")
		createTopic(b, env, topic, 1)
		p := newProducer(b, env)
		got := make(chan time.Duration, 1)
		c := newPushConsumer(b, env, uniqueName("benchLat"), uniqueInstance("lat"))
		err := c.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
			func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
				now := time.Now()
				for _, m := range msgs {
					if len(m.Body) >= 8 {
						got <- now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(m.Body))))
					}
				}
				return consumer.ConsumeSuccess, nil
			})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			body := make([]byte, 128)
			binary.BigEndian.PutUint64(body, uint64(time.Now().UnixNano()))
			if _, err := p.SendSync(context.Background(), primitive.NewMessage(topic, body)); err != nil {
				b.Fatal(err)
			}
			select {
			case d := <-got:
				lat = append(lat, d)
			case <-time.After(10 * time.Second):
				b.Fatal("message not delivered in 10 s")
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
}

// reportLatency reports the p50 and p99 of lat in milliseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

// produceOfficialBatch sends b.N messages with the official producer's
// SendAsync, benchInFlight calls outstanding, n messages per call (for
// n > 1 the official client sends them as one SEND_BATCH_MESSAGE); b.N
// counts messages, rounded up to whole batches.
func produceOfficialBatch(b *testing.B, env *brokerEnv, topic string, body []byte, n int) {
	defer labelClient()()
	p := newProducer(b, env, producer.WithRetry(0))
	if _, err := p.SendSync(context.Background(), primitive.NewMessage(topic, body)); err != nil {
		b.Fatal(err)
	}
	batch := make([]*primitive.Message, n)
	sem := make(chan struct{}, benchInFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Process()
	sent := 0
	for sent < b.N {
		for i := range batch {
			batch[i] = primitive.NewMessage(topic, body)
		}
		sent += n
		sem <- struct{}{}
		wg.Add(1)
		err := p.SendAsync(context.Background(), func(_ context.Context, res *primitive.SendResult, err error) {
			if err == nil && res.Status != primitive.SendOK {
				err = fmt.Errorf("status %v", res.Status)
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			<-sem
			wg.Done()
		}, batch...)
		if err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cputime.Process()-cpu0
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d batches failed, first: %v", n, firstErr.Load())
	}
	b.ReportMetric(float64(sent)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(sent), "cpu-us/msg")
}

// produceOfficialSync drives the official producer the other common way:
// benchInFlight goroutines, each calling SendSync in a loop (impl=official
// uses SendAsync with benchInFlight callbacks outstanding). Both share one
// producer, hence one connection, as an application's goroutines would.
func produceOfficialSync(b *testing.B, env *brokerEnv, topic string, body []byte) {
	defer labelClient()()
	p := newProducer(b, env, producer.WithRetry(0))
	if _, err := p.SendSync(context.Background(), primitive.NewMessage(topic, body)); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Process()
	for range benchInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				res, err := p.SendSync(context.Background(), primitive.NewMessage(topic, body))
				if err == nil && res.Status != primitive.SendOK {
					err = fmt.Errorf("status %v", res.Status)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cputime.Process()-cpu0
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sends failed, first: %v", n, firstErr.Load())
	}
	reportThroughput(b, elapsed, cpu)
}

// BenchmarkOfficialResponseCodec measures the official producer (SendAsync,
// 64 in flight, FlushAsync) against brokers that answer in JSON headers
// (codec=json, the default, as the official client's own requests) and in
// RocketMQ's binary headers (codec=rocketmq: remoting.WithSerializeType, as
// a Java broker started with -Drocketmq.serialize.type=ROCKETMQ). The
// official client decodes either (it reads the type from each frame) but
// always sends JSON (its codec type cannot be set by an option or an
// environment variable). cpu-us/msg is the process's: client and broker.
func BenchmarkOfficialResponseCodec(b *testing.B) {
	for _, codec := range []struct {
		name string
		st   protocol.SerializeType
	}{{"json", protocol.SerializeJSON}, {"rocketmq", protocol.SerializeRocketMQ}} {
		b.Run("codec="+codec.name, func(b *testing.B) {
			env := startBrokerEnv(b, broker.WithFlushMode(broker.FlushAsync),
				broker.WithRemotingOptions(remoting.WithSerializeType(codec.st)))
			topic := benchTopic(b, env, "BenchCodec")
			produceOfficial(b, env, topic, make([]byte, 128))
		})
	}
}
