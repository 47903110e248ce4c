package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// BenchmarkJavaPeer puts runnel's broker and client side by side with
// Apache RocketMQ's own (javapeer: the Java broker 5.3.3 from Maven Central
// and its official Java client) and the official Go client, in the same
// run on the same machine (issue 21's figures). Rows, in this order:
//
//	op=rss/msgs=N/broker=B                       resident memory after N sends of 1 KiB
//	op=produce/flush=F/size=S/broker=B/impl=I   64 sends in flight
//	op=pull/broker=B/impl=I                      draining a queue, 32 per pull
//	op=latency/broker=B/impl=I                   produce→consume, long polling
//
// broker=runnel is `runnel broker` (embedded name server + broker, Pebble
// store) in a child process; broker=java is the Java broker JVM (its name
// server is a JVM of its own, measured nowhere here), started by javapeer
// with its harness settings: -Xms320m -Xmx320m, SerialGC, 64 MiB commit log
// files, flushDiskType ASYNC_FLUSH, or SYNC_FLUSH for flush=sync (runnel:
// --flush async / sync), plus waitTimeMillsInSendQueue=5000 (see broker).
// impl=runnel is runnel's client (transport/client), impl=official the
// official Go client (rocketmq-client-go), both in this process, and
// impl=java the official Java client, unmodified, in one long-lived driver
// JVM (driver/Bench.java, full JIT) that runs each load on request: JVM
// start and client start happen before the measured windows, and the JVM
// reports each window's wall and CPU time itself.
//
// JIT: before the first rows of an op, warmJIT runs the loads of the JVMs
// involved until their CPU per message stops falling; every row's first
// call also runs its load briefly unmeasured. op=rss runs first, on the
// fresh async brokers, which then serve the other async rows (its 1M
// messages are their first load; it waits for them to be idle afterwards).
//
// Metrics: msgs/s; client-cpu-ns/msg, the client process's CPU per message
// (this process for the Go clients, the driver JVM for Java, GC and JIT
// included); broker-cpu-ns/msg, the broker process's (clock_gettime on its
// CPU-time clock, nanosecond resolution: the Java broker's own threads,
// not the kernel's writeback of its mapped files); p50-ms and p99-ms;
// rss-MiB (VmRSS of /proc/PID/status), anon-MiB (RssAnon: heap, stacks and
// other private memory, without the file pages a broker has mapped, which
// the kernel may drop) and idle-rss-MiB (VmRSS before the first send).
// scripts/bench.sh prints them by broker (-col /broker) and by client
// (-col /impl).
//
// It skips, saying why, where Java or Maven is missing (javapeer.Require)
// and off Linux. -short stores 100k messages instead of 1M for op=rss
// (RUNNEL_BENCH_RSS_MSGS sets any count).
func BenchmarkJavaPeer(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads the brokers' CPU time and memory from Linux's /proc and process CPU clocks")
	}
	pe := &peerEnv{parent: b, dist: javapeer.Require(b), brokers: map[string]*peerBroker{}}
	b.Run("op=rss", pe.benchRSS)
	b.Run("op=produce", pe.benchProduce)
	b.Run("op=pull", pe.benchPull)
	b.Run("op=latency", pe.benchLatency)
}

// Brokers and clients of BenchmarkJavaPeer.
const (
	peerInFlight    = benchInFlight          // sends in flight
	peerWarmRow     = 300 * time.Millisecond // load of a row before its first measured window
	peerWarmChunk   = time.Second            // chunk of a JIT warm-up (warmSteady)
	peerWarmMin     = 3                      // chunks of a JIT warm-up, at least
	peerWarmMax     = 6                      // and at most
	peerPullPreload = 20000                  // 128-byte messages in a pull queue
	peerPullBatch   = 32                     // messages per pull
	peerLatencyWarm = 200                    // probes before a latency row's first measured one
	peerRSSBatch    = 32                     // messages per batch send while storing op=rss's messages
)

var peerBrokers = []string{"runnel", "java"}

// peerEnv holds what BenchmarkJavaPeer's rows share: brokers (started on
// first use, so that BENCH narrows what starts) and the Java driver JVM.
// Sub-benchmarks run one at a time, so no lock.
type peerEnv struct {
	parent  *testing.B
	dist    *javapeer.Dist
	bin     string                 // the runnel command, built on first use
	brokers map[string]*peerBroker // by flush + "/" + name
	java    *javaBench
	warmed  map[string]bool          // topic/impl keys that had their warm-up
	lat     map[string]*latencyState // latency rows' state, by broker and impl
}

// parentTB is a sub-benchmark's testing.TB whose cleanups and temporary
// directories belong to BenchmarkJavaPeer itself: what it starts outlives
// the row that needed it first. Failures are still the row's own.
type parentTB struct {
	testing.TB
	parent testing.TB
}

func (p parentTB) Cleanup(f func()) { p.parent.Cleanup(f) }
func (p parentTB) TempDir() string  { return p.parent.TempDir() }

// peerBroker is a running broker of either kind and runnel's clients of it.
type peerBroker struct {
	name string // runnel or java
	key  string // flush/name, unique among the benchmark's brokers
	env  *brokerEnv
	pid  func() int
	stop func()
	rc   *client.Client
	rp   *client.Producer
	op   rocketmq.Producer // official Go producer, on first use
}

// cpu is the broker process's CPU time so far.
func (pb *peerBroker) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	d, err := processCPU(pb.pid())
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// official returns the broker's official Go producer (retries off),
// started on first use and shut down with BenchmarkJavaPeer.
func (pe *peerEnv) official(b *testing.B, pb *peerBroker) rocketmq.Producer {
	if pb.op == nil {
		pb.op = newProducer(parentTB{TB: b, parent: pe.parent}, pb.env, producer.WithRetry(0))
	}
	return pb.op
}

// broker returns the broker name (runnel or java) with flush mode flush
// (async or sync), starting it on first use.
func (pe *peerEnv) broker(b *testing.B, name, flush string) *peerBroker {
	b.Helper()
	key := flush + "/" + name
	if pb := pe.brokers[key]; pb != nil {
		return pb
	}
	tb := parentTB{TB: b, parent: pe.parent}
	pb := &peerBroker{name: name, key: key}
	switch name {
	case "runnel":
		if pe.bin == "" {
			pe.bin = buildRunnel(tb, tb.TempDir())
		}
		p := startBrokerProcFlush(tb, pe.bin, filepath.Join(tb.TempDir(), "data"), flush)
		pb.env = &brokerEnv{nsAddr: p.nsAddr, addr: p.addr}
		pb.pid = func() int { return p.cmd.Process.Pid }
		pb.stop = func() { _ = p.cmd.Process.Kill(); <-p.done } // its cleanup's Kill is then a no-op
	case "java":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// The broker refuses a send that waited more than
		// waitTimeMillsInSendQueue (200 ms) in its queue with SYSTEM_BUSY
		// [TIMEOUT_CLEAN_QUEUE]: on a shared two-core machine a 64-deep
		// window waits that long now and then. 5 s keeps every row whole;
		// nothing else about the broker's speed changes.
		opts := []javapeer.Option{javapeer.WithBrokerProperty("waitTimeMillsInSendQueue", "5000")}
		if flush == "sync" {
			opts = append(opts, javapeer.WithBrokerProperty("flushDiskType", "SYNC_FLUSH"))
		}
		c, err := pe.dist.StartCluster(ctx, tb.TempDir(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		tb.Cleanup(func() { _ = c.Close() })
		pb.env = &brokerEnv{nsAddr: c.NameServer, addr: c.Broker}
		pb.pid = c.BrokerPID
		pb.stop = func() { _ = c.Close() }
	}
	pb.rc = newRunnelClient(tb, pb.env)
	pb.rp = newRunnelProducer(tb, pb.rc, uniqueName("peerRP"), client.WithRetries(0))
	stop := pb.stop
	pb.stop = func() { // runnel's clients first (Close is idempotent), so that they do not redial
		_ = pb.rp.Close()
		_ = pb.rc.Close()
		stop()
	}
	pe.brokers[key] = pb
	return pb
}

// load runs one row's load: n messages, or when n is 0 for about d, and
// returns how many messages it sent or read, its wall time and the client
// process's CPU time.
type load func(n int, d time.Duration) (msgs int64, wall, cpu time.Duration)

// goLoad is the load of a Go client in this process: run(n, d) sends or
// reads n messages or, when n is 0, for d, and returns how many.
func goLoad(run func(n int, d time.Duration) int64) load {
	return func(n int, d time.Duration) (int64, time.Duration, time.Duration) {
		cpu, start := cputime.Process(), time.Now()
		msgs := run(n, d)
		return msgs, time.Since(start), cputime.Process() - cpu
	}
}

// javaLoad is a Java driver request as a load (count=, ms= added).
func (pe *peerEnv) javaLoad(b *testing.B, op string, args ...string) load {
	jb := pe.javaDriver(b)
	return func(n int, d time.Duration) (int64, time.Duration, time.Duration) {
		ev := jb.call(b, op, append(args, "count="+strconv.Itoa(n), "ms="+strconv.FormatInt(d.Milliseconds(), 10))...)
		if ev.Int("failed") > 0 {
			b.Fatalf("%d sends failed, first: %s", ev.Int("failed"), ev.Str("first_error"))
		}
		msgs := ev.Int("sent") + ev.Int("got")
		return msgs, time.Duration(ev.Int("ns")), time.Duration(ev.Int("cpu_ns"))
	}
}

// peerImpl is one client's row of an op on a broker: its name (runnel,
// java, official) and its load, made for the (sub-)benchmark that runs it.
type peerImpl struct {
	name string
	load func(b *testing.B) load
}

// warmJIT warms, before an op's rows on pb, what a JVM must compile first:
// the Java broker's JIT compiles its hot paths over the first seconds of a
// load, the Java client's too, and the rows would otherwise measure the
// compilers. On the first op rows of a Java broker it runs every client's
// load in turn (each client's requests take paths of their own there, JSON
// or binary headers for one); on a runnel broker, the first time only, the
// Java client's. Chunks go on until the JVMs' CPU per message is steady
// (warmSteady). runnel's broker and the Go clients have no JIT: their rows
// get row's short warm-up only.
func (pe *peerEnv) warmJIT(b *testing.B, pb *peerBroker, op string, impls []peerImpl) {
	broker := pb.name == "java" && pe.firstUse("jit/"+op+"/"+pb.key)
	client := pe.firstUse("jit/" + op + "/client=java")
	if !broker && !client {
		return
	}
	var loads []load
	var java []bool
	for _, im := range impls {
		if broker || im.name == "java" {
			loads = append(loads, im.load(b))
			java = append(java, im.name == "java")
		}
	}
	what := op + " on broker=" + pb.name
	if !broker {
		what = op + " of the Java client"
	}
	warmSteady(b, what, func(d time.Duration) float64 {
		var msgs int64
		var jvm time.Duration
		bcpu := pb.cpu(b)
		for i, l := range loads {
			n, _, cpu := l(0, d/time.Duration(len(loads)))
			msgs += n
			if java[i] {
				jvm += cpu
			}
		}
		if broker {
			jvm += pb.cpu(b) - bcpu
		}
		return float64(jvm) / float64(msgs)
	})
}

// row measures b.N messages of l on pb and reports them (reportPeer); its
// first call (key's first use) runs l for peerWarmRow unmeasured first
// (routes, connections, caches).
func (pe *peerEnv) row(b *testing.B, pb *peerBroker, key string, size int, l load) {
	if pe.firstUse(key) {
		l(0, peerWarmRow)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	bcpu := pb.cpu(b)
	msgs, wall, cpu := l(b.N, 0)
	bcpu = pb.cpu(b) - bcpu
	b.StopTimer()
	reportPeer(b, msgs, wall, cpu, bcpu)
}

// runRows warms pb for op's rows (warmJIT) and runs one impl=NAME
// sub-benchmark per client.
func (pe *peerEnv) runRows(b *testing.B, pb *peerBroker, op, key string, size int, impls []peerImpl) {
	pe.warmJIT(b, pb, op, impls)
	for _, im := range impls {
		b.Run("impl="+im.name, func(b *testing.B) {
			if im.name != "java" {
				defer labelClient()()
			}
			pe.row(b, pb, key+"/"+im.name, size, im.load(b))
		})
	}
}

// warmSteady calls chunk(peerWarmChunk), which sends or reads messages for
// that long and returns their CPU time per message, until that stops
// falling: until neither of the last two chunks is 10 % below the best
// before them (at least peerWarmMin, at most peerWarmMax chunks).
func warmSteady(b *testing.B, what string, chunk func(d time.Duration) float64) {
	b.Helper()
	var seen []float64
	for len(seen) < peerWarmMax {
		seen = append(seen, chunk(peerWarmChunk))
		if k := len(seen); k >= peerWarmMin && min(seen[k-1], seen[k-2]) >= 0.9*slices.Min(seen[:k-2]) {
			break
		}
	}
	b.Logf("warm-up of %s: %d×%v, CPU ns/msg %.0f", what, len(seen), peerWarmChunk, seen)
}

// stopBrokers stops the shared brokers of flush mode flush (their memory
// and background work should not weigh on the rows that follow).
func (pe *peerEnv) stopBrokers(flush string) {
	for _, name := range peerBrokers {
		if pb := pe.brokers[flush+"/"+name]; pb != nil {
			pb.stop()
			delete(pe.brokers, flush+"/"+name)
		}
	}
}

// topic creates a topic with n queues on pb and returns its name and
// queues.
func (pe *peerEnv) topic(b *testing.B, pb *peerBroker, prefix string, n int) (string, []protocol.MessageQueue) {
	b.Helper()
	topic := uniqueName(prefix)
	return topic, testutil.CreateTopic(b, pb.rc, pb.env.addr, topic, n)
}

// javaDriver returns the Java driver JVM, starting it on first use.
func (pe *peerEnv) javaDriver(b *testing.B) *javaBench {
	b.Helper()
	if pe.java == nil {
		pe.java = startJavaBench(b, pe.parent, pe.dist)
	}
	return pe.java
}

// firstUse reports whether key is used for the first time (it then gets
// its warm-up).
func (pe *peerEnv) firstUse(key string) bool {
	if pe.warmed == nil {
		pe.warmed = map[string]bool{}
	}
	if pe.warmed[key] {
		return false
	}
	pe.warmed[key] = true
	return true
}

// reportPeer reports a row's throughput and CPU per message.
func reportPeer(b *testing.B, msgs int64, elapsed, clientCPU, brokerCPU time.Duration) {
	b.ReportMetric(float64(msgs)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(clientCPU)/float64(msgs), "client-cpu-ns/msg")
	b.ReportMetric(float64(brokerCPU)/float64(msgs), "broker-cpu-ns/msg")
}

// ---- produce ----------------------------------------------------------------

func (pe *peerEnv) benchProduce(b *testing.B) {
	for _, fm := range benchFlushModes {
		b.Run("flush="+fm.name, func(b *testing.B) {
			if fm.name == "sync" { // the async ones serve op=pull and op=latency too
				defer pe.stopBrokers(fm.name)
			}
			for _, size := range benchSizes {
				b.Run("size="+size.name, func(b *testing.B) {
					for _, bn := range peerBrokers {
						b.Run("broker="+bn, func(b *testing.B) {
							pb := pe.broker(b, bn, fm.name)
							topic, _ := pe.topic(b, pb, "PeerProduce", 8)
							body := make([]byte, size.n)
							for i := range body {
								body[i] = byte('a' + i%26)
							}
							pe.runRows(b, pb, "produce", "produce/"+topic, size.n, []peerImpl{
								{"runnel", func(b *testing.B) load {
									return sendLoad(b, runnelSender(b, pb.rp, topic, body, peerInFlight))
								}},
								{"java", func(b *testing.B) load {
									return pe.javaLoad(b, "produce", "ns="+pb.env.nsAddr, "topic="+topic,
										"size="+strconv.Itoa(size.n), "inflight="+strconv.Itoa(peerInFlight))
								}},
								{"official", func(b *testing.B) load {
									return sendLoad(b, officialSender(b, pe.official(b, pb), topic, body, peerInFlight))
								}},
							})
						})
					}
				})
			}
		})
	}
}

// sendLoad is the load of a Go client's send (from runnelSender or
// officialSender) with peerInFlight outstanding.
func sendLoad(b *testing.B, send func(int, func(error))) load {
	return goLoad(func(n int, d time.Duration) int64 {
		w := newWindow(peerInFlight, send)
		if n > 0 {
			w.run(n)
		} else {
			for deadline := time.Now().Add(d); time.Now().Before(deadline); {
				w.run(1000)
				n += 1000
			}
		}
		if err := w.err(); err != nil {
			b.Fatal(err)
		}
		return int64(n)
	})
}

// ---- pull -------------------------------------------------------------------

func (pe *peerEnv) benchPull(b *testing.B) {
	ctx := context.Background()
	for _, bn := range peerBrokers {
		b.Run("broker="+bn, func(b *testing.B) {
			pb := pe.broker(b, bn, "async")
			topic, qs := pe.topic(b, pb, "PeerPull", 1)
			body := make([]byte, 128)
			w := newWindow(peerInFlight, func(_ int, done func(error)) {
				pb.rp.SendAsync(ctx, func(_ client.SendResult, err error) { done(err) }, &client.Message{Topic: topic, Body: body})
			})
			w.run(peerPullPreload)
			if err := w.err(); err != nil {
				b.Fatalf("preload: %v", err)
			}
			var pc rocketmq.PullConsumer // impl=official's, started on first use
			mq := &primitive.MessageQueue{Topic: topic, BrokerName: qs[0].BrokerName, QueueId: 0}
			pe.runRows(b, pb, "pull", "pull/"+pb.key, 128, []peerImpl{
				{"runnel", func(b *testing.B) load {
					return pullLoad(func(off int64) int {
						res, err := pb.rc.Pull(ctx, client.PullRequest{Queue: qs[0], Offset: off, MaxMsgs: peerPullBatch, Group: "peerPullR"})
						if err != nil || res.Status != client.PullFound {
							b.Fatalf("Pull @%d: %v %v", off, res, err)
						}
						return len(res.Messages)
					})
				}},
				{"java", func(b *testing.B) load {
					return pe.javaLoad(b, "pull", "ns="+pb.env.nsAddr, "topic="+topic, "wrap="+strconv.Itoa(peerPullPreload))
				}},
				{"official", func(b *testing.B) load {
					if pc == nil {
						pc = newLitePull(parentTB{TB: b, parent: pe.parent}, pb.env, uniqueName("peerPullO"))
						if err := pc.Assign(topic, []*primitive.MessageQueue{mq}); err != nil {
							b.Fatal(err)
						}
						if err := pc.Start(); err != nil {
							b.Fatal(err)
						}
					}
					return pullLoad(func(off int64) int {
						res, err := pc.PullFrom(ctx, mq, off, peerPullBatch)
						if err != nil || res.Status != primitive.PullFound {
							b.Fatalf("PullFrom @%d: %v %v", off, res, err)
						}
						return len(res.GetMessageExts())
					})
				}},
			})
		})
	}
}

// pullLoad is the load of a Go client's pull (of up to peerPullBatch
// messages from an offset): reading the preloaded queue from offset 0 on,
// wrapping around at peerPullPreload.
func pullLoad(pull func(off int64) int) load {
	return goLoad(func(n int, d time.Duration) int64 {
		var off, got int64
		deadline := time.Now().Add(d)
		for n > 0 && got < int64(n) || n == 0 && time.Now().Before(deadline) {
			k := pull(off)
			got += int64(k)
			if off += int64(k); off >= peerPullPreload {
				off = 0
			}
		}
		return got
	})
}

// ---- latency ----------------------------------------------------------------

// latencyBody is a latency probe: its sequence number and send time, padded
// to 128 bytes.
func latencyBody(seq int64) []byte {
	body := make([]byte, 128)
	binary.BigEndian.PutUint64(body, uint64(seq))
	binary.BigEndian.PutUint64(body[8:], uint64(time.Now().UnixNano()))
	return body
}

// arrival is a probe as a consumer saw it.
type arrival struct {
	seq int64
	lat time.Duration
}

// arrived decodes a probe's body received at now; ok is false for bodies
// that are not probes.
func arrived(body []byte, now time.Time) (arrival, bool) {
	if len(body) < 16 {
		return arrival{}, false
	}
	sent := time.Unix(0, int64(binary.BigEndian.Uint64(body[8:])))
	return arrival{seq: int64(binary.BigEndian.Uint64(body)), lat: now.Sub(sent)}, true
}

// awaitProbe waits up to d for probe seq on ch, skipping late earlier
// ones; ok is false on a timeout.
func awaitProbe(ch <-chan arrival, seq int64, d time.Duration) (time.Duration, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case a := <-ch:
			if a.seq == seq {
				return a.lat, true
			}
		case <-t.C:
			return 0, false
		}
	}
}

func (pe *peerEnv) benchLatency(b *testing.B) {
	for _, bn := range peerBrokers {
		b.Run("broker="+bn, func(b *testing.B) {
			pb := pe.broker(b, bn, "async")
			b.Run("impl=runnel", func(b *testing.B) { pe.latencyRunnel(b, pb) })
			b.Run("impl=java", func(b *testing.B) {
				jb := pe.javaDriver(b)
				ls := pe.latency(b, pb, "java")
				warm := 10
				if !ls.warmed {
					warm, ls.warmed = peerLatencyWarm, true // the first request also starts the rig
				}
				jb.call(b, "latency", "ns="+pb.env.nsAddr, "topic="+ls.topic, "count="+strconv.Itoa(warm))
				b.ResetTimer()
				ev := jb.call(b, "latency", "ns="+pb.env.nsAddr, "topic="+ls.topic, "count="+strconv.Itoa(b.N))
				b.StopTimer()
				b.ReportMetric(float64(ev.Int("p50_ns"))/1e6, "p50-ms")
				b.ReportMetric(float64(ev.Int("p99_ns"))/1e6, "p99-ms")
			})
			b.Run("impl=official", func(b *testing.B) { pe.latencyOfficial(b, pb) })
		})
	}
}

// latencyState is what one latency row keeps from one call to the next:
// its one-queue topic, the last probe's sequence number, where its
// consumer reads on, the official push consumer's probes.
type latencyState struct {
	topic  string
	seq    int64
	off    int64
	warmed bool
	ch     chan arrival
}

// latency returns the latency state of broker pb and client impl, with a
// topic of its own created on first use.
func (pe *peerEnv) latency(b *testing.B, pb *peerBroker, impl string) *latencyState {
	key := pb.name + "/" + impl
	if ls := pe.lat[key]; ls != nil {
		return ls
	}
	topic, _ := pe.topic(b, pb, "PeerLat", 1)
	ls := &latencyState{topic: topic}
	if pe.lat == nil {
		pe.lat = map[string]*latencyState{}
	}
	pe.lat[key] = ls
	return ls
}

// measureLatency sends warm probes (peerLatencyWarm on the row's first
// call, a few later), then b.N, one at a time (probe sends the next and
// waits for it), and reports the b.N's p50 and p99.
func measureLatency(b *testing.B, ls *latencyState, probe func(time.Duration) (time.Duration, bool)) {
	warm := 10
	if !ls.warmed {
		warm, ls.warmed = peerLatencyWarm, true
	}
	for range warm {
		if _, ok := probe(10 * time.Second); !ok {
			b.Fatalf("warm-up probe %d not delivered in 10 s", ls.seq)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		d, ok := probe(10 * time.Second)
		if !ok {
			b.Fatalf("probe %d not delivered in 10 s", ls.seq)
		}
		lat = append(lat, d)
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// latencyRunnel sends probes with runnel's Producer.Send, one at a time,
// to a goroutine that long-polls the queue with runnel's Client.Pull.
func (pe *peerEnv) latencyRunnel(b *testing.B, pb *peerBroker) {
	defer labelClient()()
	ls := pe.latency(b, pb, "runnel")
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan arrival, 1024)
	q := protocol.MessageQueue{Topic: ls.topic, BrokerName: pe.brokerName(b, pb, ls.topic), QueueID: 0}
	var wg sync.WaitGroup
	wg.Add(1)
	off := ls.off // the goroutine's until wg.Wait
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			req := client.PullRequest{Queue: q, Offset: off, MaxMsgs: 32, Group: "peerLatR", Suspend: 15 * time.Second}
			res, err := pb.rc.Pull(ctx, req)
			if err != nil {
				if ctx.Err() == nil {
					b.Errorf("long poll: %v", err)
				}
				return
			}
			now := time.Now()
			for i := range res.Messages {
				if a, ok := arrived(res.Messages[i].Body, now); ok {
					select {
					case ch <- a:
					default:
					}
				}
			}
			off = res.NextBeginOffset
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
		ls.off = off
	}()
	measureLatency(b, ls, func(wait time.Duration) (time.Duration, bool) {
		ls.seq++
		if _, err := pb.rp.Send(ctx, &client.Message{Topic: ls.topic, Body: latencyBody(ls.seq)}); err != nil {
			b.Fatalf("send: %v", err)
		}
		return awaitProbe(ch, ls.seq, wait)
	})
}

// brokerName is the name of the broker serving topic's queue 0.
func (pe *peerEnv) brokerName(b *testing.B, pb *peerBroker, topic string) string {
	r, err := pb.rc.RefreshRoute(context.Background(), topic)
	if err != nil || len(r.SubscribeQueues()) == 0 {
		b.Fatalf("route of %s: %v", topic, err)
	}
	return r.SubscribeQueues()[0].BrokerName
}

// latencyOfficial sends probes with the official Go producer's SendSync
// to an official push consumer (long polling), one at a time.
func (pe *peerEnv) latencyOfficial(b *testing.B, pb *peerBroker) {
	defer labelClient()()
	ls := pe.latency(b, pb, "official")
	p := pe.official(b, pb)
	probe := func(wait time.Duration) (time.Duration, bool) {
		ls.seq++
		if _, err := p.SendSync(context.Background(), primitive.NewMessage(ls.topic, latencyBody(ls.seq))); err != nil {
			b.Fatalf("SendSync: %v", err)
		}
		return awaitProbe(ls.ch, ls.seq, wait)
	}
	if ls.ch == nil {
		pe.officialLatencyRig(b, pb, ls)
		// The consumer's first rebalance may take a while to assign the
		// queue: the first probes may wait.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if _, ok := probe(time.Second); ok {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("no probe delivered to the official push consumer in 2 minutes")
			}
		}
	}
	measureLatency(b, ls, probe)
}

// officialLatencyRig starts an official push consumer of ls's topic (shut
// down with BenchmarkJavaPeer) that hands every probe to ls.ch.
func (pe *peerEnv) officialLatencyRig(b *testing.B, pb *peerBroker, ls *latencyState) {
	ch := make(chan arrival, 1024)
	c := newPushConsumer(parentTB{TB: b, parent: pe.parent}, pb.env, uniqueName("peerLatO"), uniqueInstance("lat"))
	err := c.Subscribe(ls.topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "*"},
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			now := time.Now()
			for _, m := range msgs {
				if a, ok := arrived(m.Body, now); ok {
					select {
					case ch <- a:
					default:
					}
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
	ls.ch = ch
}

// ---- resident memory --------------------------------------------------------

// peerRSSMessages is how many 1 KiB messages op=rss stores.
func peerRSSMessages(b *testing.B) int {
	if v := os.Getenv("RUNNEL_BENCH_RSS_MSGS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("RUNNEL_BENCH_RSS_MSGS=%q: want a positive count", v)
		}
		return n
	}
	if testing.Short() {
		return 100_000
	}
	return 1_000_000
}

// countName is n as a sub-benchmark name: 1M, 100k, 2500.
func countName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func (pe *peerEnv) benchRSS(b *testing.B) {
	n := peerRSSMessages(b)
	b.Run("msgs="+countName(n), func(b *testing.B) {
		for _, bn := range peerBrokers {
			var pb *peerBroker
			var idle memStatus
			b.Run("broker="+bn, func(b *testing.B) {
				if pb == nil {
					// op=rss runs first: the shared async brokers start here,
					// and the later rows find them warm.
					pb = pe.broker(b, bn, "async")
					topic, _ := pe.topic(b, pb, "PeerRSS", 8)
					idle = readMem(b, pb.pid())
					pe.store(b, pb, topic, n)
					pe.awaitIdle(b, pb)
				}
				b.ResetTimer()
				var m memStatus
				for range b.N {
					m = readMem(b, pb.pid())
				}
				b.StopTimer()
				const mib = 1 << 20
				b.ReportMetric(float64(m.rss)/mib, "rss-MiB")
				b.ReportMetric(float64(m.anon)/mib, "anon-MiB")
				b.ReportMetric(float64(idle.rss)/mib, "idle-rss-MiB")
			})
		}
	})
}

// awaitIdle waits, up to 30 s, until pb uses less than 5 % of a core
// over half a second: the work a broker defers after a burst of sends
// (Pebble's compactions, the Java broker's consume queue and flush
// services) ends before its memory is read and the next rows start.
func (pe *peerEnv) awaitIdle(b *testing.B, pb *peerBroker) {
	const window = 500 * time.Millisecond
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		c := pb.cpu(b)
		time.Sleep(window)
		if pb.cpu(b)-c < window/20 {
			break
		}
	}
	b.Logf("broker=%s idle after %v", pb.name, time.Since(start).Round(100*time.Millisecond))
}

// store sends n 1 KiB messages to topic with runnel's producer, in batches
// of peerRSSBatch, 8 batches in flight.
func (pe *peerEnv) store(b *testing.B, pb *peerBroker, topic string, n int) {
	ctx := context.Background()
	body := bytes.Repeat([]byte{'m'}, 1024)
	batch := make([]*client.Message, peerRSSBatch)
	for i := range batch {
		batch[i] = &client.Message{Topic: topic, Body: body}
	}
	w := newWindow(8, func(_ int, done func(error)) {
		pb.rp.SendAsync(ctx, func(_ client.SendResult, err error) { done(err) }, batch...)
	})
	start := time.Now()
	w.run((n + peerRSSBatch - 1) / peerRSSBatch)
	if err := w.err(); err != nil {
		b.Fatalf("storing %d messages on broker=%s: %v", n, pb.name, err)
	}
	b.Logf("broker=%s stored %d messages of 1 KiB in %v", pb.name, n, time.Since(start).Round(time.Millisecond))
}

// memStatus is a process's resident memory, in bytes.
type memStatus struct{ rss, anon int64 }

// readMem reads VmRSS and RssAnon of process pid from /proc/PID/status.
func readMem(tb testing.TB, pid int) memStatus {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	var m memStatus
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "RssAnon":
			dst = &m.anon
		default:
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			tb.Fatalf("/proc/%d/status: %s:%s", pid, k, v)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/status: %s: %v", pid, k, err)
		}
		*dst = kb << 10
	}
	if m.rss == 0 {
		tb.Fatalf("/proc/%d/status has no VmRSS", pid)
	}
	return m
}

// ---- the Java driver JVM ----------------------------------------------------

// javaBenchJVM are the driver JVM's flags for benchmarks: the full JIT
// (javapeer's default driver flags stop at C1 for a quick start), a fixed
// heap, the serial collector (two cores: no spare one for a concurrent
// collector).
var javaBenchJVM = []string{"-Xms256m", "-Xmx256m", "-XX:+UseSerialGC", "-Xshare:auto"}

// javaBench is the driver's bench command (driver/Bench.java) running in a
// JVM that takes requests on a control connection.
type javaBench struct {
	pr     *javapeer.Proc
	conn   net.Conn
	rd     *bufio.Reader
	mu     sync.Mutex
	cancel context.CancelFunc
}

// startJavaBench starts the driver JVM, owned by parent (which stops it at
// its end), and waits for it to connect.
func startJavaBench(b *testing.B, parent *testing.B, d *javapeer.Dist) *javaBench {
	b.Helper()
	tb := parentTB{TB: b, parent: parent}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	dr := d.NewDriver(tb).WithJVM(javaBenchJVM...)
	ctx, cancel := context.WithCancel(context.Background())
	// --namesrv is required by the driver; every bench request names its own.
	pr, err := dr.Start(ctx, ln.Addr().String(), "bench", "--control", ln.Addr().String())
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for range pr.Events() {
		}
	}()
	jb := &javaBench{pr: pr, cancel: cancel}
	parent.Cleanup(func() {
		if jb.conn != nil {
			_, _ = jb.roundTrip("quit")
			_ = jb.conn.Close()
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			pr.Kill()
			<-exited
		}
		_ = pr.Wait()
		cancel()
	})
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		acc <- accepted{c, err}
	}()
	select {
	case a := <-acc:
		if a.err != nil {
			b.Fatal(a.err)
		}
		jb.conn, jb.rd = a.c, bufio.NewReader(a.c)
	case <-exited:
		_ = ln.Close()
		<-acc
		b.Fatalf("the Java bench driver exited before connecting: %v\n%s", pr.Wait(), pr.Output())
	case <-time.After(2 * time.Minute):
		_ = ln.Close()
		<-acc
		b.Fatalf("the Java bench driver did not connect in 2 minutes\n%s", pr.Output())
	}
	return jb
}

// call sends one request ("op key=value ...") and returns its "done"
// answer; an error answer or a broken connection fails tb.
func (jb *javaBench) call(tb testing.TB, op string, args ...string) javapeer.Event {
	tb.Helper()
	ev, err := jb.roundTrip(op, args...)
	if err != nil {
		tb.Fatalf("Java bench driver, %s %s: %v\n%s", op, strings.Join(args, " "), err, jb.pr.Output())
	}
	return ev
}

func (jb *javaBench) roundTrip(op string, args ...string) (javapeer.Event, error) {
	jb.mu.Lock()
	defer jb.mu.Unlock()
	if err := jb.conn.SetDeadline(time.Now().Add(10 * time.Minute)); err != nil {
		return nil, err
	}
	line := strings.Join(append([]string{op}, args...), " ") + "\n"
	if _, err := jb.conn.Write([]byte(line)); err != nil {
		return nil, err
	}
	resp, err := jb.rd.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	var ev javapeer.Event
	if err := json.Unmarshal(resp, &ev); err != nil {
		return nil, fmt.Errorf("answer %q: %w", resp, err)
	}
	if ev.Kind() != "done" {
		return ev, fmt.Errorf("answer %s", bytes.TrimSpace(resp))
	}
	return ev, nil
}
