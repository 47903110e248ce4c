package pipeline_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil/cputime"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

const (
	benchLatency  = 5 * time.Millisecond
	benchCapacity = 100
	// benchRequests is one op of BenchmarkAsyncIO: at the bound
	// (capacity / latency = 20k requests/s) about 2 s.
	benchRequests = 40_000
)

// lateTimers sets timers to deliver a latency: Go's timers fire late
// (measured here: a 5 ms timer took 5.19 ms alone, 5.34 ms with 10 in
// flight, 5.52 ms with 100, the netpoller's wait having millisecond
// resolution), so a service that slept 5 ms would have a latency of
// 5.5-5.9 ms and BenchmarkAsyncIO's bound, capacity ÷ 5 ms, could not be
// reached by any operator. lateTimers keeps a moving average of how late
// its timers fired and sets the next ones that much earlier, so that the
// latency delivered is the nominal one on average; svc-ms reports what
// was delivered.
type lateTimers struct {
	latency time.Duration
	mu      sync.Mutex
	early   time.Duration // how much earlier to set timers
}

// delay is how long to set the next timer for.
func (l *lateTimers) delay() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latency - l.early
}

// fired records that a timer set at start fired now and returns how
// long it took.
func (l *lateTimers) fired(start time.Time) time.Duration {
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	// Each sample moves the correction by 1/32 of its error, within
	// [0, latency/2].
	l.early = max(0, min(l.early+(took-l.latency)/32, l.latency/2))
	return took
}

// latencyServer is a TCP service on loopback that answers every request
// (an 8-byte id) with the same id after its latency (lateTimers):
// pipelined, any number of requests in flight per connection.
type latencyServer struct {
	ln      net.Listener
	latency *lateTimers
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startLatencyServer(tb testing.TB, latency time.Duration) *latencyServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &latencyServer{ln: ln, latency: &lateTimers{latency: latency}}
	s.wg.Add(1)
	go s.accept()
	tb.Cleanup(s.close)
	return s
}

func (s *latencyServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve reads requests and answers each latency later; one writer
// goroutine batches the answers.
func (s *latencyServer) serve(c net.Conn) {
	defer s.wg.Done()
	out := make(chan uint64, 4096)
	var timers sync.WaitGroup
	var writer sync.WaitGroup
	writer.Add(1)
	go func() {
		defer writer.Done()
		bw := bufio.NewWriter(c)
		var b [8]byte
		for id := range out {
			binary.BigEndian.PutUint64(b[:], id)
			if _, err := bw.Write(b[:]); err != nil {
				continue // the client is gone: drain
			}
			if len(out) == 0 {
				_ = bw.Flush()
			}
		}
	}()
	br := bufio.NewReader(c)
	var b [8]byte
	for {
		if _, err := io.ReadFull(br, b[:]); err != nil {
			break
		}
		id := binary.BigEndian.Uint64(b[:])
		timers.Add(1)
		start := time.Now()
		time.AfterFunc(s.latency.delay(), func() {
			defer timers.Done()
			s.latency.fired(start)
			out <- id
		})
	}
	timers.Wait()
	close(out)
	writer.Wait()
}

func (s *latencyServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// muxClient sends requests over a few connections to a latencyServer and
// completes each request's ResultFuture when its answer arrives.
type muxClient struct {
	conns []*muxConn
	next  atomic.Uint64
	wg    sync.WaitGroup
	rtt   atomic.Int64 // the answered requests' round trips, summed
}

type muxConn struct {
	c  net.Conn
	mu sync.Mutex // guards w and pending
	w  *bufio.Writer
	// pending are the requests sent and not answered, by id.
	pending map[uint64]pendingReq
}

type pendingReq struct {
	rf   pipeline.ResultFuture[int64]
	sent time.Time
}

func dialMux(tb testing.TB, addr string, n int) *muxClient {
	m := &muxClient{}
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		mc := &muxConn{c: c, w: bufio.NewWriter(c), pending: map[uint64]pendingReq{}}
		m.conns = append(m.conns, mc)
		m.wg.Add(1)
		go m.read(mc)
	}
	return m
}

func (m *muxClient) read(mc *muxConn) {
	defer m.wg.Done()
	br := bufio.NewReader(mc.c)
	var b [8]byte
	for {
		if _, err := io.ReadFull(br, b[:]); err != nil {
			mc.mu.Lock()
			for id, p := range mc.pending {
				p.rf.CompleteError(err)
				delete(mc.pending, id)
			}
			mc.mu.Unlock()
			return
		}
		id := binary.BigEndian.Uint64(b[:])
		mc.mu.Lock()
		p, ok := mc.pending[id]
		delete(mc.pending, id)
		mc.mu.Unlock()
		if ok {
			m.rtt.Add(int64(time.Since(p.sent)))
			p.rf.Complete(int64(id))
		}
	}
}

// call is an AsyncFutureFunc: it sends v's request and returns.
func (m *muxClient) call(_ context.Context, v int64, rf pipeline.ResultFuture[int64]) {
	mc := m.conns[m.next.Add(1)%uint64(len(m.conns))]
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	mc.mu.Lock()
	mc.pending[uint64(v)] = pendingReq{rf: rf, sent: time.Now()}
	_, err := mc.w.Write(b[:])
	if err == nil {
		err = mc.w.Flush()
	}
	if err != nil {
		delete(mc.pending, uint64(v))
	}
	mc.mu.Unlock()
	if err != nil {
		rf.CompleteError(err)
	}
}

func (m *muxClient) close() {
	for _, mc := range m.conns {
		_ = mc.c.Close()
	}
	m.wg.Wait()
}

// BenchmarkAsyncIO: an async I/O operator (one subtask, capacity 100)
// against a service of 5 ms latency, whose bound is capacity ÷ latency =
// 20,000 requests/s; %bound is the share of it reached (the target is at
// least 90). One op is one job over 40,000 records from a one-split
// generator to a counting sink.
//
//   - service=tcp: a loopback TCP service, requests pipelined over 4
//     connections, completed through ResultFutures (UnorderedWaitFuture);
//     svc-ms is the mean round trip the client saw;
//   - service=timer: no network: an AsyncFunc waiting 5 ms
//     (UnorderedWait): the operator's own ceiling; svc-ms is how long
//     the waits actually took.
//
// Both services set their timers early by how late Go's timers have
// been firing (lateTimers), so that their latency is 5 ms on average as
// the bound assumes; svc-ms shows what they delivered (a loaded machine
// still fires some late), and %svc-bound is the share reached of
// capacity ÷ svc-ms: what the operator makes of the service it was given.
func BenchmarkAsyncIO(b *testing.B) {
	for _, svc := range []string{"tcp", "timer"} {
		b.Run("service="+svc, func(b *testing.B) {
			var took, cpu time.Duration
			var waited atomic.Int64 // how long the service took: timer waits, or TCP round trips
			timers := &lateTimers{latency: benchLatency}
			for range b.N {
				b.StopTimer()
				var client *muxClient
				if svc == "tcp" {
					srv := startLatencyServer(b, benchLatency)
					client = dialMux(b, srv.ln.Addr().String(), 4)
				}
				var seen atomic.Int64
				job := pipeline.New("bench-async", pipeline.CheckpointDir(b.TempDir()), pipeline.CheckpointInterval(time.Second))
				src := pipeline.FromSource(job, "gen", source.NewGenerator(1, benchRequests, func(_ int, seq uint64) int64 { return int64(seq) }))
				opts := []pipeline.OperatorOption{pipeline.Parallelism(1), pipeline.AsyncCapacity(benchCapacity), pipeline.AsyncTimeout(10 * time.Second)}
				var out *pipeline.Stream[int64]
				if client != nil {
					out = pipeline.UnorderedWaitFuture(src, "call", client.call, opts...)
				} else {
					out = pipeline.UnorderedWait(src, "call", func(ctx context.Context, v int64) (int64, error) {
						start := time.Now()
						t := time.NewTimer(timers.delay())
						defer t.Stop()
						select {
						case <-t.C:
							waited.Add(int64(timers.fired(start)))
							return v, nil
						case <-ctx.Done():
							return 0, ctx.Err()
						}
					}, opts...)
				}
				pipeline.To(out, "count", sink.NewFunc(func(context.Context, int64) error { seen.Add(1); return nil }, nil))
				b.StartTimer()
				start, cpu0 := time.Now(), cputime.Process()
				err := job.Run(context.Background())
				took += time.Since(start)
				cpu += cputime.Process() - cpu0
				b.StopTimer()
				if client != nil {
					client.close()
					waited.Add(client.rtt.Load())
				}
				if err != nil && !errors.Is(err, context.Canceled) {
					b.Fatal(err)
				}
				if n := seen.Load(); n != benchRequests {
					b.Fatalf("%d results, want %d", n, benchRequests)
				}
				b.StartTimer()
			}
			n := float64(b.N) * benchRequests
			rate := n / took.Seconds()
			b.ReportMetric(rate, "req/s")
			b.ReportMetric(100*rate/(benchCapacity/benchLatency.Seconds()), "%bound")
			b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/req")
			if w := waited.Load(); w > 0 {
				// The service's latency as this machine delivers it (a
				// loaded machine fires timers late): the bound the
				// operator can reach is capacity ÷ that.
				svc := float64(w) / n / 1e9
				b.ReportMetric(svc*1e3, "svc-ms")
				b.ReportMetric(100*rate/(benchCapacity/svc), "%svc-bound")
			}
		})
	}
}
