package interop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The scale-out kill test runs examples/etl as three worker processes (this
// test binary re-executed as TestScaleoutETLChild) on one job, SIGKILLs
// them at random instants, restarts each (half of the time on an empty
// state directory), and checks the output with the official Go client.
const (
	envSOChild    = "RUNNEL_SCALEOUT_CHILD"
	envSONamesrv  = "RUNNEL_SCALEOUT_NAMESRV"
	envSODir      = "RUNNEL_SCALEOUT_DIR"
	envSOName     = "RUNNEL_SCALEOUT_NAME"
	envSOKill     = "RUNNEL_SCALEOUT_KILL" // "n": SIGKILL itself a few ms into its n-th commit
	envSOControl  = "RUNNEL_SCALEOUT_CONTROL"
	envSOInterval = "RUNNEL_SCALEOUT_INTERVAL"

	soIn, soOut, soDLQ = "so_orders", "so_orders_enriched", "so_orders_dlq"
	soJob              = "so_etl"
	soReady            = "scaleout-child: ready"
)

// TestScaleoutETLChild is one worker of the scale-out kill test (it does
// nothing unless started by it).
func TestScaleoutETLChild(t *testing.T) {
	if os.Getenv(envSOChild) == "" {
		t.Skip("only run as a child of TestScaleoutETLKill")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println(soReady)
	c, err := client.New(client.WithNameServers(os.Getenv(envSONamesrv)), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
		client.WithInstanceName(os.Getenv(envSOName)), client.WithHeartbeatInterval(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	interval, _ := time.ParseDuration(os.Getenv(envSOInterval))
	var sinkOpts []mqsink.TxOption
	if n, err := strconv.Atoi(os.Getenv(envSOKill)); err == nil && n > 0 {
		var commits int
		var mu sync.Mutex
		sinkOpts = append(sinkOpts, phaseHook(func(p mqsink.Phase, _ uint64) {
			if p != mqsink.PhaseCommitStart {
				return
			}
			mu.Lock()
			commits++
			hit := commits == n
			mu.Unlock()
			if hit {
				fmt.Fprintf(os.Stderr, "scaleout child: SIGKILL in commit %d\n", n)
				time.AfterFunc(time.Duration(1+rand.IntN(3))*time.Millisecond, func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) })
			}
		})...)
	}
	var wopts []pipeline.JobOption
	switch os.Getenv(envSOControl) {
	case "read-uncommitted":
		wopts = append(wopts, scaleoutFaults(failpoint.Scaleout{ReadUncommitted: true})...)
	case "skip-confirm":
		wopts = append(wopts, scaleoutFaults(failpoint.Scaleout{SkipConfirm: true, KeepLostLocks: true})...)
	}
	err = etl.Run(ctx, c, etl.Config{In: soIn, Out: soOut, DLQ: soDLQ, Group: soJob, StateDir: os.Getenv(envSODir),
		CheckpointInterval: interval, Ranges: 8, SinkOptions: sinkOpts, WorkerOptions: wopts,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

type soChild struct {
	name string
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error
}

type soEnv struct {
	t              *testing.T
	ns             string
	b              *broker.Broker
	c              *client.Client
	samples        []etl.Sample
	valid, invalid int64
	control        string // a failpoint.Scaleout control mode, "" for none
	base           string
	dirs           int
}

// newSOEnv starts an embedded cluster with the ETL topics (an 8-queue
// input) and n sample orders of 300 customers in the input.
func newSOEnv(t *testing.T, n int, seed uint64, control string, bopts ...broker.Option) *soEnv {
	t.Helper()
	cl := testutil.RunCluster(t, append([]broker.Option{broker.WithTransactionTimeout(time.Second),
		broker.WithTransactionCheckInterval(300 * time.Millisecond), broker.WithTransactionCheckMax(1000)}, bopts...)...)
	e := &soEnv{t: t, ns: cl.NameServer, b: cl.Broker, control: control, base: t.TempDir()}
	e.setup(cl.BrokerAddr, n, seed)
	return e
}

// setup creates the ETL topics on the broker at addr and loads n sample
// orders into the input.
func (e *soEnv) setup(addr string, n int, seed uint64) {
	t := e.t
	// Heartbeats every 500 ms: a broker with a short client expiry (the
	// zombie test's) would otherwise close this idle client's connection.
	c, err := client.New(client.WithNameServers(e.ns), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
		client.WithHeartbeatInterval(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	e.c = c
	testutil.CreateTopic(t, c, addr, soIn, 8)
	testutil.CreateTopic(t, c, addr, soOut, 8)
	testutil.CreateTopic(t, c, addr, soDLQ, 2)
	e.samples = etl.SampleOrders(n, 300, 100, seed)
	p := testutil.NewProducer(t, c, "so_input")
	if err := etl.Produce(context.Background(), c, p, soIn, e.samples, nil); err != nil {
		t.Fatal(err)
	}
	for _, s := range e.samples {
		if s.Valid {
			e.valid++
		} else {
			e.invalid++
		}
	}
}

// newDir returns a new, empty state directory.
func (e *soEnv) newDir() string {
	e.dirs++
	return filepath.Join(e.base, fmt.Sprintf("state-%d", e.dirs))
}

// finish waits until the output covers the input (restarting workers that
// killed themselves), stops every worker with SIGTERM, reads the output
// back with the official Go client and returns the E1 oracle's report and
// its count of problems.
func (e *soEnv) finish(workers []*soChild, dirs []string) (*etl.Report, int) {
	t := e.t
	t.Helper()
	// A control's broken protocol may also leave the job stuck (two
	// workers each running a task whose chain the other extends): then the
	// oracle reads what was committed after a shorter wait.
	wait := 180 * time.Second
	if e.control != "" {
		wait = 60 * time.Second
	}
	deadline := time.Now().Add(wait)
	var last [2]int64
	var since time.Time
	for {
		o, d := e.committed()
		// Covered, and stable for 2 s (duplicates could cover the input
		// while orders are still being processed).
		if o >= e.valid && d >= e.invalid {
			if [2]int64{o, d} != last {
				last, since = [2]int64{o, d}, time.Now()
			} else if time.Since(since) > 2*time.Second {
				break
			}
		}
		for i, w := range workers {
			if w == nil {
				continue
			}
			select {
			case <-w.done:
				workers[i] = e.start(w.name+"-again", dirs[i], "")
			default:
			}
		}
		if time.Now().After(deadline) {
			if e.control != "" {
				t.Logf("control: the job did not finish (%d/%d outputs and %d/%d dead letters committed); the oracle reads what was", o, e.valid, d, e.invalid)
				break
			}
			t.Fatalf("only %d/%d outputs and %d/%d dead letters were committed\nlast worker logs:\n%s", o, e.valid, d, e.invalid, tailLog(workers))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, w := range workers {
		if w == nil {
			continue
		}
		for !strings.Contains(w.out.String(), soReady) {
			time.Sleep(20 * time.Millisecond)
		}
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, w := range workers {
		if w == nil {
			continue
		}
		select {
		case err := <-w.done:
			if err != nil && !killedBy(err, syscall.SIGKILL) {
				t.Errorf("worker %s on SIGTERM: %v\n%s", w.name, err, w.out.String())
			}
		case <-time.After(60 * time.Second):
			_ = w.cmd.Process.Kill()
			<-w.done
			t.Errorf("worker %s did not stop on SIGTERM", w.name)
		}
		workers[i] = nil
	}
	// Pending half messages end by check-back: give them a moment, then
	// read everything back with the official Go client.
	time.Sleep(2 * time.Second)
	out := readAllOfficial(t, e.ns, soOut)
	dlq := readAllOfficial(t, e.ns, soDLQ)
	r := etl.Verify(e.samples, out, dlq)
	bad := r.Missing + r.Duplicated + r.OutOfOrder + r.WrongValue + r.Unexpected + r.DLQMissing + r.DLQDuplicated + r.DLQUnexpected
	return r, bad
}

// stopAll SIGKILLs the workers still running (test clean-up).
func stopAll(workers []*soChild) {
	for _, w := range workers {
		if w != nil {
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	}
}

func (e *soEnv) start(name, dir, kill string) *soChild {
	e.t.Helper()
	if kill != "" || e.control != "" {
		requireFailpoints(e.t)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestScaleoutETLChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envSOChild+"=1", envSONamesrv+"="+e.ns, envSODir+"="+dir, envSOName+"="+name,
		envSOInterval+"=200ms", envSOKill+"="+kill)
	if e.control != "" {
		cmd.Env = append(cmd.Env, envSOControl+"="+e.control)
	}
	ch := &soChild{name: name, cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = ch.out, ch.out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { ch.done <- cmd.Wait() }()
	return ch
}

func (e *soEnv) committed() (out, dlq int64) {
	var err error
	for range 3 { // a connection the broker closed is dialled again
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		o, err1 := etl.Count(ctx, e.c, soOut)
		d, err2 := etl.Count(ctx, e.c, soDLQ)
		cancel()
		if err = errors.Join(err1, err2); err == nil {
			return o, d
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatal(err)
	return 0, 0
}

// TestScaleoutETLKill is issue 23's proof: the ETL job as 3 worker
// processes over an 8-queue topic, 100k orders of 300 customers, 20 SIGKILLs
// at random instants (some right after a restart, during the rebalance it
// causes; some a few milliseconds into a commit), half of the replacements
// on an empty state directory. The official Go client then reads every
// output and dead letter, and the E1 oracle (etl.Verify) must find every
// valid order exactly once with its lineage and per-customer
// customer_order_count exactly 1..n, and every invalid order in the DLQ
// once. The control variant takes repartition batches without asking their
// origin's commit chain (read uncommitted): the oracle must find the
// duplicates that lets through.
func TestScaleoutETLKill(t *testing.T) {
	if raceEnabled {
		// Three workers and the broker under the race detector on two
		// cores are so slow that the test measures the detector: run it
		// in a child built without -race (nothing of it is shared memory
		// across goroutines that this build would check beyond what the
		// workers' own packages' -race tests check).
		runWithoutRace(t, "^TestScaleoutETLKill$")
		return
	}
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) { testScaleoutETLKill(t, control) })
	}
}

func testScaleoutETLKill(t *testing.T, control bool) {
	seed := testSeedSO(t)
	rng := rand.New(rand.NewPCG(seed, 23))
	mode := ""
	if control {
		requireFailpoints(t)
		mode = "read-uncommitted"
	}
	e := newSOEnv(t, 100_000, seed, mode)
	workers := make([]*soChild, 3)
	dirs := make([]string, 3)
	for i := range workers {
		dirs[i] = e.newDir()
		workers[i] = e.start(fmt.Sprintf("w%d-0", i), dirs[i], "")
	}
	defer stopAll(workers)
	const kills = 20
	empty, phase, rebalance := 0, 0, 0
	for k := range kills {
		wait := time.Duration(400+rng.IntN(1600)) * time.Millisecond
		if k > 0 && rng.IntN(3) == 0 {
			wait = time.Duration(100+rng.IntN(400)) * time.Millisecond // during the rebalance the last restart caused
			rebalance++
		}
		time.Sleep(wait)
		i := rng.IntN(len(workers))
		w := workers[i]
		select {
		case err := <-w.done:
			if !strings.Contains(w.out.String(), "SIGKILL in commit") {
				t.Fatalf("worker %s ended on its own: %v\n%s", w.name, err, w.out.String())
			}
		default:
			_ = w.cmd.Process.Signal(syscall.SIGKILL)
			<-w.done
		}
		kill := ""
		if rng.IntN(4) == 0 {
			kill = strconv.Itoa(1 + rng.IntN(5)) // it kills itself within a commit
			phase++
		}
		fresh := rng.IntN(2) == 0
		if fresh {
			dirs[i] = e.newDir()
			empty++
		}
		workers[i] = e.start(fmt.Sprintf("w%d-%d", i, k+1), dirs[i], kill)
		o, d := e.committed()
		t.Logf("kill %d: worker %d (restarted on %s state directory, self-kill in commit %q): %d outputs, %d dead letters committed",
			k+1, i, map[bool]string{true: "an empty", false: "its"}[fresh], kill, o, d)
	}
	t.Logf("%d kills: %d replacements on an empty state directory, %d during a rebalance, %d self-kills planned within a commit", kills, empty, rebalance, phase)
	r, bad := e.finish(workers, dirs)
	t.Logf("oracle: %s", r)
	if control {
		if bad == 0 {
			t.Fatalf("control: reading repartition batches uncommitted went unnoticed by the oracle (%s)", r)
		}
		t.Logf("control failed the oracle as it must: %s\n%s", r, strings.Join(r.Examples, "\n"))
		return
	}
	if bad != 0 {
		t.Fatalf("oracle: %s\n%s", r, strings.Join(r.Examples, "\n"))
	}
}

func testSeedSO(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RUNNEL_SCALEOUT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (RUNNEL_SCALEOUT_SEED reproduces the input and the kill plan)", seed)
	return seed
}

// runWithoutRace runs the tests matching run in a child `go test` of this
// package built without -race, and fails t with its output if it fails.
func runWithoutRace(t *testing.T, run string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"test", "-count=1", "-timeout=10m", "-run", run, "-v"}
	if failpoint.Enabled {
		// The child must have the faults of the control variants and the
		// phase hooks of the kill points too: without the tag they are
		// compiled out and a control cannot fail.
		args = append(args, "-tags", "failpoints")
	}
	cmd := exec.CommandContext(ctx, goTool(), append(args, ".")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a child built without -race: %v\n%s", run, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "oracle:") || strings.Contains(l, "kills:") || strings.HasPrefix(strings.TrimSpace(l), "--- ") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

func tailLog(ws []*soChild) string {
	var b strings.Builder
	for _, w := range ws {
		s := w.out.String()
		if len(s) > 3000 {
			s = s[len(s)-3000:]
		}
		fmt.Fprintf(&b, "== %s\n%s\n", w.name, s)
	}
	return b.String()
}

func killedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// readAllOfficial reads every message of topic with the official Go
// client's lite pull consumer (a new group, from the first offset) until
// it has as many as the broker's max offsets say, and returns them as
// runnel's protocol.MessageExt (body and properties) for etl.Verify.
func readAllOfficial(t *testing.T, ns, topic string) []protocol.MessageExt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc, err := client.New(client.WithNameServers(ns), client.WithClientIP(netip.MustParseAddr("127.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want, err := etl.Count(ctx, rc, topic)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := rocketmq.NewPullConsumer(
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{ns})),
		consumer.WithGroupName(uniqueName("so_oracle")),
		consumer.WithInstance(uniqueInstance("so-oracle")),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithAutoCommit(false),
		consumer.WithPullBatchSize(32),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Shutdown() }()
	if err := pc.Subscribe(topic, consumer.MessageSelector{}); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	var out []protocol.MessageExt
	seen := map[string]bool{} // queue/offset: the official lite pull may hand a message twice on rebalance
	for int64(len(out)) < want {
		if ctx.Err() != nil {
			t.Fatalf("official client read %d of %d messages of %s", len(out), want, topic)
		}
		cr, err := pc.Poll(ctx, 500*time.Millisecond)
		if errors.Is(err, consumer.ErrNoNewMsg) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cr.GetMsgList() {
			k := fmt.Sprintf("%s/%d/%d", m.Queue.BrokerName, m.Queue.QueueId, m.QueueOffset)
			if seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, protocol.MessageExt{Topic: m.Topic, QueueID: int32(m.Queue.QueueId), QueueOffset: m.QueueOffset,
				Body: m.Body, Properties: encodeProps(m.GetProperties())})
		}
		pc.ACK(ctx, cr, consumer.ConsumeSuccess)
	}
	return out
}

// encodeProps writes properties in RocketMQ's wire form (name 0x01 value
// 0x02 …).
func encodeProps(m map[string]string) string {
	var b strings.Builder
	for k, v := range m {
		b.WriteString(k)
		b.WriteByte(1)
		b.WriteString(v)
		b.WriteByte(2)
	}
	return b.String()
}
