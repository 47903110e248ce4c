package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
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
	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// The scale-out benchmarks (scaleout_bench_test.go,
// scaleout_handoff_bench_test.go) run every process of a job apart: the
// embedded name server and broker in one child process and each worker in
// another, all of them this test binary re-executed as
// TestScaleoutBenchChild with its role in envSOBench (JSON). So each
// process's CPU time is its own: the workers' from their rusage when they
// exit, the broker's from /proc while it runs.
const (
	envSOBench = "RUNNEL_E2E_SO_BENCH"
	// envSOProfile names a directory: every child then writes a CPU
	// profile there (-test.cpuprofile), named after its role and instance.
	envSOProfile = "RUNNEL_BENCH_SO_PROFILE"
	// envSODebug makes the children log at debug level (their output is
	// shown when a benchmark fails).
	envSODebug = "RUNNEL_BENCH_SO_DEBUG"

	// Lines the children print on stdout.
	soLineBroker = "so-broker"  // namesrv address, broker address
	soLineStatus = "so-status"  // a worker's status address
	soLineReady  = "so-ready"   // SIGTERM is handled from here on
	soLineFilled = "so-filled"  // handoff: every key of the input has its state
	soLineFirst  = "so-first"   // handoff: Unix ns of the first record a task processed, found
	soLineState  = "so-restore" // handoff: a task processed a key whose state it had restored
)

// soChildConfig is a child's role and setup.
type soChildConfig struct {
	Role     string // "broker", "etl" or "handoff"
	Namesrv  string
	Dir      string
	Instance string

	// etl and handoff
	Job, In, Out, DLQ string
	Interval          time.Duration
	Standbys, Ranges  int
	// etl
	Single, Partitioned bool
	// handoff: the keys of the input, each given ValueSize bytes of state
	Keys, ValueSize int
}

// TestScaleoutBenchChild is one process of a scale-out benchmark (it does
// nothing unless started by one).
func TestScaleoutBenchChild(t *testing.T) {
	raw := os.Getenv(envSOBench)
	if raw == "" {
		t.Skip("only run as a child of the scale-out benchmarks")
	}
	var cfg soChildConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println(soLineReady)
	level := slog.LevelWarn
	if os.Getenv(envSODebug) != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var err error
	switch cfg.Role {
	case "broker":
		err = soBrokerChild(ctx, cfg)
	case "etl":
		err = soETLChild(ctx, cfg, log)
	case "handoff":
		err = soHandoffChild(ctx, cfg, log)
	default:
		err = fmt.Errorf("unknown role %q", cfg.Role)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func soBrokerChild(ctx context.Context, cfg soChildConfig) error {
	startCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cl, err := embedded.Start(startCtx, embedded.WithDataDir(cfg.Dir))
	if err != nil {
		return err
	}
	fmt.Println(soLineBroker, cl.NameServer(), cl.BrokerAddr())
	<-ctx.Done()
	return cl.Close()
}

func soClient(cfg soChildConfig) (*client.Client, error) {
	return client.New(client.WithNameServers(cfg.Namesrv), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
		client.WithInstanceName(cfg.Instance))
}

// soETLChild runs examples/etl's job: as one worker (etl.Run's default) or,
// with Single, as today's single-process job.
func soETLChild(ctx context.Context, cfg soChildConfig, log *slog.Logger) error {
	c, err := soClient(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	ec := etl.Config{SingleProcess: cfg.Single, Partitioned: cfg.Partitioned, In: cfg.In, Out: cfg.Out, DLQ: cfg.DLQ,
		Group: cfg.Job, StateDir: cfg.Dir, CheckpointInterval: cfg.Interval, Ranges: cfg.Ranges, Standbys: cfg.Standbys,
		Logger: log}
	if !cfg.Single {
		ec.StatusAddr = "127.0.0.1:0"
		ec.OnStatusAddr = func(a string) { fmt.Println(soLineStatus, a) }
	}
	return etl.Run(ctx, c, ec)
}

// The hand-off job: keys (8-byte big-endian bodies) from a topic
// partitioned by key, each given ValueSize bytes of incompressible state on
// its first record (a pre-partitioned keyed stage, so that every queue is
// one task holding its keys' state).
const (
	soHandoffSource = "keys"
	soHandoffFill   = "fill"
)

type soFilled struct {
	Key   uint64
	Found bool // the key's state was there before this record
}

type soFillFn struct {
	size int
	v    *state.Value[[]byte]
	buf  []byte
}

func (f *soFillFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.v, err = state.NewValue(ctx.Backend(), "v", state.BytesCodec())
	return err
}

func (f *soFillFn) ProcessElement(ctx *pipeline.KeyedContext[uint64, soFilled], k uint64) error {
	v, ok, err := f.v.Get()
	if err != nil {
		return err
	}
	if ok {
		if len(v) != f.size || !bytes.Equal(v, soValue(f.buf[:0], k, f.size)) {
			return fmt.Errorf("key %d: restored state of %d bytes differs from what was stored", k, len(v))
		}
		return ctx.Emit(soFilled{Key: k, Found: true})
	}
	if err := f.v.Set(soValue(make([]byte, 0, f.size), k, f.size)); err != nil {
		return err
	}
	return ctx.Emit(soFilled{Key: k})
}

func (f *soFillFn) OnTimer(*pipeline.KeyedContext[uint64, soFilled], pipeline.Timer) error {
	return nil
}

// soValue appends key k's state value: size pseudo-random bytes.
func soValue(dst []byte, k uint64, size int) []byte {
	r := rand.New(rand.NewPCG(k, 0x5ca1e))
	for len(dst)+8 <= size {
		dst = binary.LittleEndian.AppendUint64(dst, r.Uint64())
	}
	for len(dst) < size {
		dst = append(dst, byte(r.Uint32()))
	}
	return dst
}

func soHandoffChild(ctx context.Context, cfg soChildConfig, log *slog.Logger) error {
	c, err := soClient(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	var seen atomic.Int64
	var first sync.Once
	build := func(job *pipeline.Job) error {
		src, err := srcmq.New(c, cfg.In)
		if err != nil {
			return err
		}
		keys := pipeline.FromSourceDecoded(job, soHandoffSource, src, func(m srcmq.Message) (uint64, error) {
			if len(m.Body) != 8 {
				return 0, fmt.Errorf("key body of %d bytes", len(m.Body))
			}
			return binary.BigEndian.Uint64(m.Body), nil
		}, pipeline.NoWatermarks())
		filled := pipeline.Process(pipeline.KeyBy(keys, func(k uint64) uint64 { return k }).PrePartitioned(), soHandoffFill,
			func() pipeline.KeyedProcessFunc[uint64, uint64, soFilled] { return &soFillFn{size: cfg.ValueSize} })
		pipeline.To(filled, "sink", sink.NewFunc(func(_ context.Context, f soFilled) error {
			first.Do(func() { fmt.Println(soLineFirst, time.Now().UnixNano(), f.Found) })
			if f.Found {
				fmt.Println(soLineState, f.Key)
			} else if seen.Add(1) == int64(cfg.Keys) {
				fmt.Println(soLineFilled)
			}
			return nil
		}, nil))
		return nil
	}
	opts := []pipeline.JobOption{pipeline.CheckpointDir(cfg.Dir), pipeline.CheckpointInterval(cfg.Interval), pipeline.Logger(log),
		pipeline.StatusAddress("127.0.0.1:0", func(a string) { fmt.Println(soLineStatus, a) })}
	if cfg.Standbys > 0 {
		opts = append(opts, pipeline.Standbys(cfg.Standbys))
	}
	return pipeline.RunWorker(ctx, c, cfg.Job, build, opts...)
}

// soProc is a child process of a scale-out benchmark.
type soProc struct {
	name string
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{} // closed once it exited (then err is set)
	err  error
}

// startSOProc starts a child with cfg; cleanup kills it if it still runs.
func startSOProc(tb testing.TB, name string, cfg soChildConfig) *soProc {
	tb.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{"-test.run=^TestScaleoutBenchChild$", "-test.count=1"}
	if dir := os.Getenv(envSOProfile); dir != "" {
		args = append(args, "-test.cpuprofile="+filepath.Join(dir, fmt.Sprintf("%s-%s-%d.pprof", cfg.Role, name, time.Now().UnixNano())))
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envSOBench+"="+string(raw))
	p := &soProc{name: name, cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// exited reports whether the process has ended.
func (p *soProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// line waits for the first output line starting with prefix and returns
// its fields after the prefix.
func (p *soProc) line(tb testing.TB, prefix string, timeout time.Duration) []string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if f, ok := p.find(prefix); ok {
			return f
		}
		if p.exited() {
			tb.Fatalf("%s exited (%v) before printing %q:\n%s", p.name, p.err, prefix, javapeer.Tail([]byte(p.out.String()), 50))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s printed no %q within %v:\n%s", p.name, prefix, timeout, javapeer.Tail([]byte(p.out.String()), 50))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// find returns the fields after prefix of the first output line starting
// with it.
func (p *soProc) find(prefix string) ([]string, bool) {
	sc := bufio.NewScanner(strings.NewReader(p.out.String()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == prefix {
			return f[1:], true
		}
	}
	return nil, false
}

// stop sends SIGTERM (once the child handles it) and waits for the exit;
// it fails tb when the child does not stop within timeout or fails.
func (p *soProc) stop(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	p.line(tb, soLineReady, timeout)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		tb.Fatalf("%s did not stop within %v of SIGTERM:\n%s", p.name, timeout, javapeer.Tail([]byte(p.out.String()), 50))
	}
	if p.err != nil {
		tb.Fatalf("%s: %v\n%s", p.name, p.err, javapeer.Tail([]byte(p.out.String()), 50))
	}
}

// kill SIGKILLs the child and waits for it.
func (p *soProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// cpu is the CPU time (user + system) of an exited child.
func (p *soProc) cpu() time.Duration {
	<-p.done
	return p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
}

// soBroker is the benchmark's name server and broker in a child process.
type soBroker struct {
	p        *soProc
	ns, addr string
	c        *client.Client
}

func startSOBroker(tb testing.TB) *soBroker {
	tb.Helper()
	if runtime.GOOS != "linux" {
		tb.Skip("reads the broker process's CPU time from /proc")
	}
	p := startSOProc(tb, "broker", soChildConfig{Role: "broker", Dir: filepath.Join(tb.TempDir(), "broker")})
	f := p.line(tb, soLineBroker, 60*time.Second)
	if len(f) != 2 {
		tb.Fatalf("broker printed %q", f)
	}
	sb := &soBroker{p: p, ns: f[0], addr: f[1]}
	c, err := newMQClient(sb.ns)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = c.Close()
		p.stop(tb, 60*time.Second)
	})
	sb.c = c
	return sb
}

// cpuNow is the broker process's CPU time so far (10 ms ticks).
func (sb *soBroker) cpuNow(tb testing.TB) time.Duration {
	tb.Helper()
	return procStatCPU(tb, sb.p.cmd.Process.Pid)
}

func (sb *soBroker) createTopic(tb testing.TB, topic string, n int) {
	tb.Helper()
	testutil.CreateTopic(tb, sb.c, sb.addr, topic, n)
}

// procStatCPU returns the user + system CPU time process pid has used,
// from /proc/PID/stat (in USER_HZ ticks of 10 ms).
func procStatCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The command name (field 2) is parenthesised and may hold spaces.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		tb.Fatalf("/proc/%d/stat: no command name in %q", pid, raw)
	}
	f := bytes.Fields(raw[i+1:])
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		tb.Fatalf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	var ticks int64
	for _, j := range []int{utime, stime} {
		n, err := strconv.ParseInt(string(f[j]), 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat field %d: %v", pid, j+3, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100)
}

// workerStatus reads a worker's /status.
func workerStatus(ctx context.Context, addr string) (*pipeline.WorkerStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no idle connection outlives the call
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s: %s", addr, res.Status)
	}
	var st pipeline.WorkerStatus
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return nil, err
	}
	return &st, nil
}
