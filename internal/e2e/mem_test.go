package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
)

// The memory benchmarks (`make mem`; they skip unless RUNNEL_BENCH_MEM is
// set, as they take minutes) measure resident memory (VmRSS, VmHWM) and
// the Go heap of a process running only what is measured: this test
// binary re-executed as TestMemChild, its role in envMemChild (JSON).
//
// BenchmarkMemBroker: the embedded name server + broker (default options:
// the store's Pebble block cache and memtable of 64 MiB each, the half
// message cache of 32 MiB) while it stores 1M messages of 1 KiB
// (RUNNEL_BENCH_MEM_MSGS sets another count), while 100 consumers
// long-poll it, and per idle connection (1000 TCP connections that send
// nothing).
//
// BenchmarkMemKeyedState: a keyed job (2 subtasks, default state options:
// a read cache of 32 MiB and a write-back layer bounded at 64 MiB per
// subtask, the checkpoint store's memtable of 64 MiB) counting 1M and 10M
// distinct keys (each key once, so every record misses the caches and the
// state grows beyond them): its peak resident memory and heap, sampled
// every 50 ms.
const (
	envMemChild = "RUNNEL_E2E_MEM_CHILD"
	envMemBench = "RUNNEL_BENCH_MEM"
	envMemMsgs  = "RUNNEL_BENCH_MEM_MSGS"

	memLineReady = "mem-ready" // http address of the memory report
	memLineDone  = "mem-done"  // keyed: the job's report (JSON)
	mib          = 1 << 20
)

type memChildConfig struct {
	Role string // "broker" or "keyed"
	Dir  string
	Keys int64 // keyed: distinct keys (one record each)
}

// memReport is a process's memory, in bytes.
type memReport struct {
	RSS, HWM   int64 // VmRSS, VmHWM
	Heap       int64 // live heap after a GC (HeapAlloc)
	HeapSys    int64 // heap address space obtained from the OS
	Goroutines int
	FDs        int
	// keyed: peaks of the sampled RSS and heap (HeapAlloc, not after a
	// forced GC), the job's time and records.
	PeakRSS, PeakHeap int64
	Seconds           float64
	Records           int64
}

func readMemReport(gc bool) memReport {
	if gc {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r := memReport{Heap: int64(ms.HeapAlloc), HeapSys: int64(ms.HeapSys), Goroutines: runtime.NumGoroutine()}
	r.RSS, r.HWM = procStatus()
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		r.FDs = len(ents)
	}
	return r
}

// procStatus returns VmRSS and VmHWM of this process (0 off Linux).
func procStatus() (rss, hwm int64) {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// TestMemChild is the process of a memory benchmark (it does nothing
// unless started by one).
func TestMemChild(t *testing.T) {
	raw := os.Getenv(envMemChild)
	if raw == "" {
		t.Skip("only run as a child of the memory benchmarks")
	}
	var cfg memChildConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var err error
	switch cfg.Role {
	case "broker":
		err = memBrokerChild(ctx, cfg)
	case "keyed":
		err = memKeyedChild(ctx, cfg)
	default:
		err = fmt.Errorf("unknown role %q", cfg.Role)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// memBrokerChild runs the embedded cluster and serves its memory report
// (GET /mem, after a GC) until SIGTERM.
func memBrokerChild(ctx context.Context, cfg memChildConfig) error {
	startCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cl, err := embedded.Start(startCtx, embedded.WithDataDir(cfg.Dir))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return errors.Join(err, cl.Close())
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(readMemReport(true))
	}), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	fmt.Println(memLineReady, ln.Addr(), cl.NameServer(), cl.BrokerAddr())
	<-ctx.Done()
	err = srv.Close()
	wg.Wait()
	return errors.Join(err, cl.Close())
}

// memKeyedChild runs a keyed count over cfg.Keys distinct keys, sampling
// its memory every 50 ms, and prints its report.
func memKeyedChild(ctx context.Context, cfg memChildConfig) error {
	var peakRSS, peakHeap atomic.Int64
	sctx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			rss, _ := procStatus()
			runtime.ReadMemStats(&ms)
			peakRSS.Store(max(peakRSS.Load(), rss))
			peakHeap.Store(max(peakHeap.Load(), int64(ms.HeapAlloc)))
		}
	})
	job := pipeline.New("mem-keyed", pipeline.CheckpointDir(cfg.Dir), pipeline.CheckpointInterval(time.Second),
		pipeline.DefaultParallelism(2))
	perSplit := cfg.Keys / benchSplits
	src := pipeline.FromSource(job, "gen", source.NewGenerator(benchSplits, perSplit,
		func(split int, seq uint64) uint64 { return seq*benchSplits + uint64(split) }))
	counts := pipeline.Process(pipeline.KeyBy(src, func(k uint64) uint64 { return k }), "count",
		func() pipeline.KeyedProcessFunc[uint64, uint64, counted] { return &countFn{} })
	var seen atomic.Int64
	pipeline.To(counts, "sink", sink.NewFunc(func(context.Context, counted) error { seen.Add(1); return nil }, nil))
	start := time.Now()
	err := job.Run(ctx)
	took := time.Since(start)
	stopSampling()
	wg.Wait()
	if err != nil {
		return err
	}
	if got := seen.Load(); got != perSplit*benchSplits {
		return fmt.Errorf("sink saw %d records, want %d", got, perSplit*benchSplits)
	}
	r := readMemReport(false)
	r.PeakRSS, r.PeakHeap, r.Seconds, r.Records = max(peakRSS.Load(), r.RSS), peakHeap.Load(), took.Seconds(), seen.Load()
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fmt.Println(memLineDone, string(raw))
	return nil
}

// memProc is a running TestMemChild.
type memProc struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{}
	err  error
}

func startMemProc(tb testing.TB, cfg memChildConfig) *memProc {
	tb.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envMemChild+"="+string(raw))
	p := &memProc{cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// line waits for the child's first output line starting with prefix and
// returns the rest of it.
func (p *memProc) line(tb testing.TB, prefix string, timeout time.Duration) string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for l := range strings.Lines(p.out.String()) {
			if rest, ok := strings.CutPrefix(strings.TrimRight(l, "\n"), prefix+" "); ok {
				return rest
			}
		}
		select {
		case <-p.done:
			tb.Fatalf("the child exited (%v) before printing %q:\n%s", p.err, prefix, javapeer.Tail([]byte(p.out.String()), 50))
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the child printed no %q within %v:\n%s", prefix, timeout, javapeer.Tail([]byte(p.out.String()), 50))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func skipUnlessMem(b *testing.B) {
	if os.Getenv(envMemBench) == "" {
		b.Skip("memory benchmarks take minutes: `make mem` (or " + envMemBench + "=1) runs them")
	}
}

func getMem(b *testing.B, addr string) memReport {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/mem")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var r memReport
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		b.Fatal(err)
	}
	return r
}

func memMsgs() int {
	if v, err := strconv.Atoi(os.Getenv(envMemMsgs)); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 100_000
	}
	return 1_000_000
}

// BenchmarkMemBroker: see the comment at the top of this file. Metrics
// (MiB unless named otherwise): idle-heap, idle-rss, stored-heap and
// stored-rss with the messages stored (stored-hwm: the peak while storing),
// poll-heap and poll-rss with 100 consumers long-polling, and
// idle-conn-rss-KiB and idle-conn-heap-KiB per idle connection.
func BenchmarkMemBroker(b *testing.B) {
	skipUnlessMem(b)
	n := memMsgs()
	for range b.N {
		p := startMemProc(b, memChildConfig{Role: "broker", Dir: filepath.Join(b.TempDir(), "broker")})
		f := strings.Fields(p.line(b, memLineReady, 90*time.Second))
		memAddr, ns, brokerAddr := f[0], f[1], f[2]
		c, err := newMQClient(ns)
		if err != nil {
			b.Fatal(err)
		}
		topic := "mem_stored"
		testutil.CreateTopic(b, c, brokerAddr, topic, 8)
		idle := getMem(b, memAddr)

		// 1. n messages of 1 KiB, batches of 32, 8 batches in flight.
		prod, err := client.NewProducer(c, "mem_producer")
		if err != nil {
			b.Fatal(err)
		}
		body := bytes.Repeat([]byte{'m'}, 1024)
		for i := range body {
			body[i] = byte('a' + i*7%26) // not one repeated byte: less compressible
		}
		start := time.Now()
		memStore(b, prod, topic, body, n)
		b.Logf("stored %d messages of 1 KiB in %v", n, time.Since(start).Round(time.Millisecond))
		stored := getMem(b, memAddr)

		// 2. 100 consumers (a client, so a connection, each) long-polling
		// an empty queue.
		const pollers = 100
		pollTopic := "mem_poll"
		qs := testutil.CreateTopic(b, c, brokerAddr, pollTopic, 4)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var parked atomic.Int64
		for i := range pollers {
			pc, err := newMQClient(ns)
			if err != nil {
				b.Fatal(err)
			}
			q := qs[i%len(qs)]
			wg.Go(func() {
				defer pc.Close()
				first := true
				for ctx.Err() == nil {
					if first {
						parked.Add(1)
						first = false
					}
					_, _ = pc.Pull(ctx, client.PullRequest{Queue: q, Offset: 0, Suspend: 15 * time.Second,
						Group: "mem_pollers_" + strconv.Itoa(i)})
				}
			})
		}
		for parked.Load() < pollers {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // every pull sent and parked
		poll := getMem(b, memAddr)
		cancel()
		wg.Wait()

		// 3. idle connections: connected, nothing sent.
		const idleConns = 1000
		before := getMem(b, memAddr)
		conns := make([]net.Conn, 0, idleConns)
		for range idleConns {
			cn, err := net.Dial("tcp", brokerAddr)
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, cn)
		}
		time.Sleep(time.Second)
		after := getMem(b, memAddr)
		for _, cn := range conns {
			_ = cn.Close()
		}
		_ = prod.Close()
		_ = c.Close()

		m := func(v int64) float64 { return float64(v) / mib }
		b.ReportMetric(m(idle.Heap), "idle-heap-MiB")
		b.ReportMetric(m(idle.RSS), "idle-rss-MiB")
		b.ReportMetric(m(stored.Heap), "stored-heap-MiB")
		b.ReportMetric(m(stored.RSS), "stored-rss-MiB")
		b.ReportMetric(m(stored.HWM), "stored-hwm-MiB")
		b.ReportMetric(m(poll.Heap), "poll-heap-MiB")
		b.ReportMetric(m(poll.RSS), "poll-rss-MiB")
		b.ReportMetric(float64(after.RSS-before.RSS)/idleConns/1024, "idle-conn-rss-KiB")
		b.ReportMetric(float64(after.Heap-before.Heap)/idleConns/1024, "idle-conn-heap-KiB")
		b.Logf("idle %+v\nstored %+v\npolling %+v\nidle conns before %+v after %+v", idle, stored, poll, before, after)
	}
}

// memStore sends n messages of body to topic in batches of 32, 8 batches
// in flight.
func memStore(b *testing.B, p *client.Producer, topic string, body []byte, n int) {
	b.Helper()
	const batchLen = 32
	batch := make([]*client.Message, batchLen)
	for i := range batch {
		batch[i] = &client.Message{Topic: topic, Body: body}
	}
	ctx := context.Background()
	sem := make(chan struct{}, 8)
	var failed atomic.Pointer[error]
	for sent := 0; sent < n && failed.Load() == nil; sent += batchLen {
		sem <- struct{}{}
		p.SendAsync(ctx, func(_ client.SendResult, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
			<-sem
		}, batch...)
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	if e := failed.Load(); e != nil {
		b.Fatal(*e)
	}
}

// BenchmarkMemKeyedState: see the comment at the top of this file. Metrics:
// peak-rss-MiB, peak-heap-MiB (sampled), end-rss-MiB and records/s.
func BenchmarkMemKeyedState(b *testing.B) {
	skipUnlessMem(b)
	for _, keys := range []int64{1_000_000, 10_000_000} {
		if testing.Short() && keys > 1_000_000 {
			continue
		}
		b.Run("keys="+countLabel(keys), func(b *testing.B) {
			for range b.N {
				p := startMemProc(b, memChildConfig{Role: "keyed", Dir: filepath.Join(b.TempDir(), "job"), Keys: keys})
				var r memReport
				if err := json.Unmarshal([]byte(p.line(b, memLineDone, 30*time.Minute)), &r); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(r.PeakRSS)/mib, "peak-rss-MiB")
				b.ReportMetric(float64(r.PeakHeap)/mib, "peak-heap-MiB")
				b.ReportMetric(float64(r.RSS)/mib, "end-rss-MiB")
				b.ReportMetric(float64(r.Records)/r.Seconds, "records/s")
				b.Logf("%+v", r)
			}
		})
	}
}

func countLabel(n int64) string {
	if n%1_000_000 == 0 {
		return strconv.FormatInt(n/1_000_000, 10) + "M"
	}
	return strconv.FormatInt(n, 10)
}
