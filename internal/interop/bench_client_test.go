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
// One op is one message. The sending goroutines are labelled side=client
// (labelClient) for `go tool pprof -tagfocus side=client`; runnel's
// connection reader is labelled remoting=reader like the broker's (tell
// them apart by remoting.startClientConn vs remoting.(*Server).serveConn). allocs/op and B/op count the whole process: the
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
	w := newWindow(inflight, send)
	m := startMeasure(b)
	w.run(b.N)
	m.stop(b, int64(b.N))
	if err := w.err(); err != nil {
		b.Fatal(err)
	}
}

// window runs sends with at most a fixed number outstanding (see
// sendWindow), batch after batch.
type window struct {
	sem      chan struct{}
	wg       sync.WaitGroup
	failed   atomic.Int64
	firstErr atomic.Value
	send     func(i int, done func(error))
	done     func(error)
}

func newWindow(inflight int, send func(i int, done func(error))) *window {
	w := &window{sem: make(chan struct{}, inflight), send: send}
	w.done = func(err error) {
		if err != nil {
			w.failed.Add(1)
			w.firstErr.CompareAndSwap(nil, err)
		}
		<-w.sem
		w.wg.Done()
	}
	return w
}

// run makes n sends and waits for all of them.
func (w *window) run(n int) {
	for i := range n {
		w.sem <- struct{}{}
		w.wg.Add(1)
		w.send(i, w.done)
	}
	w.wg.Wait()
}

// err reports the sends that failed so far, nil if none.
func (w *window) err() error {
	if n := w.failed.Load(); n > 0 {
		return fmt.Errorf("%d sends failed, first: %v", n, w.firstErr.Load())
	}
	return nil
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
	defer labelClient()()
	send := runnelSender(b, p, topic, body, inflight)
	b.SetBytes(int64(len(body)))
	sendWindow(b, inflight, send)
}

// runnelSender warms p's route and connection to topic and returns the
// send of one message for a window of inflight: Send when 1, SendAsync
// otherwise.
func runnelSender(b *testing.B, p *client.Producer, topic string, body []byte, inflight int) func(int, func(error)) {
	ctx := context.Background()
	if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: body}); err != nil {
		b.Fatal(err)
	}
	if inflight == 1 {
		return func(_ int, done func(error)) {
			_, err := p.Send(ctx, &client.Message{Topic: topic, Body: body})
			done(err)
		}
	}
	return func(_ int, done func(error)) {
		p.SendAsync(ctx, func(_ client.SendResult, err error) { done(err) }, &client.Message{Topic: topic, Body: body})
	}
}

func produceClientOfficial(b *testing.B, p rocketmq.Producer, topic string, body []byte, inflight int) {
	defer labelClient()()
	send := officialSender(b, p, topic, body, inflight)
	b.SetBytes(int64(len(body)))
	sendWindow(b, inflight, send)
}

// officialSender is runnelSender for the official producer: SendSync when
// inflight is 1, SendAsync otherwise.
func officialSender(b *testing.B, p rocketmq.Producer, topic string, body []byte, inflight int) func(int, func(error)) {
	ctx := context.Background()
	if _, err := p.SendSync(ctx, primitive.NewMessage(topic, body)); err != nil {
		b.Fatal(err)
	}
	check := func(res *primitive.SendResult, err error) error {
		if err == nil && res.Status != primitive.SendOK {
			err = fmt.Errorf("status %v", res.Status)
		}
		return err
	}
	if inflight == 1 {
		return func(_ int, done func(error)) {
			done(check(p.SendSync(ctx, primitive.NewMessage(topic, body))))
		}
	}
	return func(_ int, done func(error)) {
		err := p.SendAsync(ctx, func(_ context.Context, res *primitive.SendResult, err error) {
			done(check(res, err))
		}, primitive.NewMessage(topic, body))
		if err != nil {
			done(err)
		}
	}
}

// pairedChunk is how many messages each client sends in turn in
// BenchmarkClientProducePaired.
const pairedChunk = 1000

// BenchmarkClientProducePaired measures the rows of BenchmarkClientProduce
// (same broker settings, payloads, producers' options and send calls) with
// the two clients taking turns within one benchmark: chunks of pairedChunk
// messages, runnel's and the official client's alternating (which one goes
// first alternates too). The garbage collector is left alone: a cycle is
// triggered in a chunk in proportion to the bytes the chunk allocates, so
// each client pays for its own garbage, except that a cycle started near
// the end of a chunk finishes in the next one (slightly against the client
// that allocates less). Forcing a collection before each chunk instead would
// leave most chunks without any, which favours the client that allocates
// more (in a trial: official 9.8k msgs/s at 128 B, 1 in flight, against
// 5-7k in BenchmarkClientProduce). Both thus see
// the same machine load, which on a shared machine drifts over the seconds
// that separate BenchmarkClientProduce's impl=runnel and impl=official runs
// (with -count, a benchmark's runs are consecutive). One op is one message
// of each client. It reports each client's msgs/s and cpu-us/msg (process
// CPU per message, broker included) and the ratios runnel/official of
// msgs/s (x-msgs/s) and official/runnel of cpu-us/msg (x-cpu).
func BenchmarkClientProducePaired(b *testing.B) {
	env := startBrokerEnv(b, broker.WithFlushMode(broker.FlushAsync))
	rc := newRunnelClient(b, env)
	rp := newRunnelProducer(b, rc, uniqueName("benchRPP"), client.WithRetries(0))
	op := newProducer(b, env, producer.WithRetry(0))
	for _, size := range benchSizes {
		for _, inflight := range []int{1, benchInFlight} {
			b.Run(fmt.Sprintf("size=%s/inflight=%d", size.name, inflight), func(b *testing.B) {
				defer labelClient()()
				topic := benchTopic(b, env, "BenchClientPaired")
				body := make([]byte, size.n)
				for i := range body {
					body[i] = byte('a' + i%26)
				}
				wins := [2]*window{
					newWindow(inflight, runnelSender(b, rp, topic, body, inflight)),
					newWindow(inflight, officialSender(b, op, topic, body, inflight)),
				}
				var wall, cpu [2]time.Duration
				b.ReportAllocs()
				b.ResetTimer()
				for done, turn := 0, 0; done < b.N; turn++ {
					n := min(pairedChunk, b.N-done)
					for k := range 2 {
						impl := (turn + k) % 2
						t, c := time.Now(), cputime.Process()
						wins[impl].run(n)
						wall[impl] += time.Since(t)
						cpu[impl] += cputime.Process() - c
					}
					done += n
				}
				b.StopTimer()
				for impl, name := range []string{"runnel", "official"} {
					if err := wins[impl].err(); err != nil {
						b.Fatalf("%s: %v", name, err)
					}
					b.ReportMetric(float64(b.N)/wall[impl].Seconds(), name+"-msgs/s")
					b.ReportMetric(float64(cpu[impl])/float64(time.Microsecond)/float64(b.N), name+"-cpu-us/msg")
				}
				b.ReportMetric(float64(wall[1])/float64(wall[0]), "x-msgs/s")
				if cpu[0] > 0 {
					b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "x-cpu")
				}
			})
		}
	}
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
	defer labelClient()()
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

// BenchmarkClientPullPaired drains the same preloaded queue as
// BenchmarkClientPull with runnel's Client.Pull and the official lite pull
// consumer taking turns every pairedChunk messages within each run, so
// that load drifting between consecutive runs on a shared machine cannot
// skew their ratio (x-msgs/s: runnel's msgs/s ÷ the official client's;
// x-cpu: the official client's CPU per message ÷ runnel's).
func BenchmarkClientPullPaired(b *testing.B) {
	env, topic, _ := preloadPullQueue(b, "BenchClientPullPaired")
	ctx := context.Background()
	c := newRunnelClient(b, env)
	q := protocol.MessageQueue{Topic: topic, BrokerName: broker0, QueueID: 0}
	pc := newLitePull(b, env, uniqueName("benchPullPO"))
	mq := &primitive.MessageQueue{Topic: topic, BrokerName: broker0, QueueId: 0}
	if err := pc.Assign(topic, []*primitive.MessageQueue{mq}); err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		b.Fatal(err)
	}
	pulls := [2]func(off int64) int{
		func(off int64) int {
			res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 32, Group: "benchPullPR"})
			if err != nil || res.Status != client.PullFound {
				b.Fatalf("Pull @%d: %v %v", off, res, err)
			}
			return len(res.Messages)
		},
		func(off int64) int {
			res, err := pc.PullFrom(ctx, mq, off, 32)
			if err != nil || res.Status != primitive.PullFound {
				b.Fatalf("PullFrom @%d: %v %v", off, res, err)
			}
			return len(res.GetMessageExts())
		},
	}
	defer labelClient()()
	var offs [2]int64
	var got [2]int
	for i := range pulls { // warm the routes and connections
		pulls[i](0)
	}
	var wall, cpu [2]time.Duration
	b.ResetTimer()
	for turn := 0; got[0] < b.N || got[1] < b.N; turn++ {
		for k := range 2 {
			impl := (turn + k) % 2
			t, cp := time.Now(), cputime.Process()
			for end := got[impl] + pairedChunk; got[impl] < end; {
				n := pulls[impl](offs[impl])
				got[impl] += n
				if offs[impl] += int64(n); offs[impl] >= pullPreload {
					offs[impl] = 0
				}
			}
			wall[impl] += time.Since(t)
			cpu[impl] += cputime.Process() - cp
		}
	}
	b.StopTimer()
	for impl, name := range []string{"runnel", "official"} {
		b.ReportMetric(float64(got[impl])/wall[impl].Seconds(), name+"-msgs/s")
		b.ReportMetric(float64(cpu[impl])/float64(time.Microsecond)/float64(got[impl]), name+"-cpu-us/msg")
	}
	b.ReportMetric((float64(got[0])/wall[0].Seconds())/(float64(got[1])/wall[1].Seconds()), "x-msgs/s")
	b.ReportMetric((float64(cpu[1])/float64(got[1]))/(float64(cpu[0])/float64(got[0])), "x-cpu")
}

// pullLoop calls pull from offset 0 on, wrapping around at preload, until
// b.N messages were read, and reports msgs/s.
func pullLoop(b *testing.B, preload int64, pull func(off int64) int) {
	b.Helper()
	defer labelClient()()
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
