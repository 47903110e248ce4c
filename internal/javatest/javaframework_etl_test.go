package javatest

import (
	"cmp"
	"context"
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The ETL kill test re-executes this test binary, running only
// TestJavaBrokerETLChild, as the job process (examples/etl's job in its
// single-process mode, etl.Run) on the Java broker; these variables carry
// its setup.
const (
	envJETLChild    = "RUNNEL_JAVATEST_ETL_CHILD"
	envJETLNamesrv  = "RUNNEL_JAVATEST_ETL_NAMESRV"
	envJETLDir      = "RUNNEL_JAVATEST_ETL_DIR"
	envJETLTopics   = "RUNNEL_JAVATEST_ETL_TOPICS" // in,out,dlq,group
	envJETLInterval = "RUNNEL_JAVATEST_ETL_INTERVAL"
	envJETLKill     = "RUNNEL_JAVATEST_ETL_KILL"   // "phase:n": SIGKILL itself at the n-th occurrence of phase
	envJETLFaults   = "RUNNEL_JAVATEST_ETL_FAULTS" // "blind-restore": the sink's restore commits again without looking; "at-least-once": the job's at-least-once sinks
)

// jetlChildReady is the line a child prints once it handles SIGTERM.
const jetlChildReady = "javatest-etl-child: ready"

// jetlKillPhases are the phases a child can be told to die in:
// "commit-mid" a few milliseconds into a commit (END_TRANSACTIONs in
// flight), "commit-ended" once every END_TRANSACTION of a commit was
// answered (the checkpoint still lists it: the restore finds it pending).
var jetlKillPhases = map[string]mqsink.Phase{"commit-mid": mqsink.PhaseCommitStart, "commit-ended": mqsink.PhaseCommitEnded}

func jetlKillHook(spec string) func(mqsink.Phase, uint64) {
	name, ns, ok := strings.Cut(spec, ":")
	if !ok {
		return nil
	}
	want, ok := jetlKillPhases[name]
	n, err := strconv.Atoi(ns)
	if !ok || err != nil {
		panic("bad " + envJETLKill + " " + spec)
	}
	kill := func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never continue past the kill point
	}
	var hits atomic.Int64
	return func(p mqsink.Phase, _ uint64) {
		if p != want || hits.Add(1) != int64(n) {
			return
		}
		fmt.Fprintf(os.Stderr, "javatest etl child: SIGKILL at %s\n", spec)
		if name == "commit-mid" {
			time.AfterFunc(time.Duration(1+rand.IntN(3))*time.Millisecond, kill)
			return
		}
		kill()
	}
}

// TestJavaBrokerETLChild is the job process of TestJavaBrokerETLExactlyOnce
// (it does nothing unless started by it).
func TestJavaBrokerETLChild(t *testing.T) {
	if os.Getenv(envJETLChild) == "" {
		t.Skip("only run as the child of TestJavaBrokerETLExactlyOnce")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println(jetlChildReady)
	c, err := client.New(client.WithNameServers(os.Getenv(envJETLNamesrv)), client.WithClientIP(netip.MustParseAddr("127.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	interval, err := time.ParseDuration(os.Getenv(envJETLInterval))
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Split(os.Getenv(envJETLTopics), ",")
	if len(names) != 4 {
		t.Fatalf("bad %s", envJETLTopics)
	}
	var opts []mqsink.TxOption
	if h := jetlKillHook(os.Getenv(envJETLKill)); h != nil {
		opts = append(opts, phaseHook(h)...)
	}
	mode := os.Getenv(envJETLFaults)
	if mode == "blind-restore" {
		opts = append(opts, txFaults(failpoint.Tx{BlindRestoreCommit: true})...)
	}
	err = etl.Run(ctx, c, etl.Config{SingleProcess: true, AtLeastOnce: mode == "at-least-once", In: names[0], Out: names[1], DLQ: names[2], Group: names[3],
		StateDir: filepath.Join(os.Getenv(envJETLDir), "job"), CheckpointInterval: interval, Parallelism: 2, SinkOptions: opts,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
}

// jetlEnv is one ETL kill test's topics and input on a Java cluster.
type jetlEnv struct {
	jc                *javapeer.Cluster
	c                 *client.Client
	in, out, dlq, grp string
	samples           []etl.Sample
	valid, invalid    int64
	dir               string
	killMax           time.Duration         // a random kill comes up to this long after the run's first output (default 800 ms)
	read              []protocol.MessageExt // the output the last run's oracle read
}

func newJETLEnv(t *testing.T, jc *javapeer.Cluster, n int, seed uint64) *jetlEnv {
	t.Helper()
	c := newJavaClient(t, jc)
	e := &jetlEnv{jc: jc, c: c, in: uniqueName(t, "orders"), out: uniqueName(t, "enriched"), dlq: uniqueName(t, "dlq"),
		grp: uniqueName(t, "etl"), dir: t.TempDir()}
	createJavaTopic(t, c, jc, e.in, 4)
	createJavaTopic(t, c, jc, e.out, 4)
	createJavaTopic(t, c, jc, e.dlq, 2)
	e.samples = etl.SampleOrders(n, 200, 50, seed)
	for i := range e.samples {
		if e.samples[i].Valid {
			e.valid++
		} else {
			e.invalid++
		}
	}
	p := newJavaProducer(t, c, uniqueName(t, "etlin"))
	start := time.Now()
	if err := etl.Produce(bg(t, time.Minute), c, p, e.in, e.samples, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("produced %d orders in %v", n, time.Since(start).Round(time.Millisecond))
	return e
}

type jetlChild struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error // its exit (one receive)
	exit chan struct{}
}

func (e *jetlEnv) start(t *testing.T, kill, faults string, interval time.Duration) *jetlChild {
	t.Helper()
	if kill != "" || faults == "blind-restore" {
		requireFailpoints(t)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestJavaBrokerETLChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envJETLChild+"=1", envJETLNamesrv+"="+e.jc.NameServer, envJETLDir+"="+e.dir,
		envJETLTopics+"="+strings.Join([]string{e.in, e.out, e.dlq, e.grp}, ","), envJETLInterval+"="+interval.String(),
		envJETLKill+"="+kill, envJETLFaults+"="+faults)
	ch := &jetlChild{cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan error, 1), exit: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = ch.out, ch.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		ch.done <- cmd.Wait()
		close(ch.exit)
	}()
	t.Cleanup(func() {
		select {
		case <-ch.exit:
		default:
			_ = cmd.Process.Kill()
			<-ch.exit
		}
	})
	return ch
}

func (e *jetlEnv) committed(t *testing.T) (out, dlq int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := etl.Count(ctx, e.c, e.out)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err = etl.Count(ctx, e.c, e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	return out, dlq
}

// complete reports whether the output holds every valid order and the
// dead-letter topic every invalid one. Counts suffice when nothing is
// duplicated (exactly-once); at-least-once output can reach the counts
// with duplicates before the job read all its input, so its output is
// read and checked.
func (e *jetlEnv) complete(t *testing.T, faults string) bool {
	t.Helper()
	if faults != "at-least-once" {
		return true
	}
	ctx := bg(t, time.Minute)
	out, err := etl.ReadAll(ctx, e.c, e.out)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := etl.ReadAll(ctx, e.c, e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	r := etl.Verify(e.samples, out, dlq)
	return r.Missing == 0 && r.DLQMissing == 0
}

func jetlKilled(err error) bool {
	ee, ok := err.(*exec.ExitError)
	if !ok {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// run runs the child once per entry of plan — killed by the parent at a
// random moment (""), or by itself at the phase the entry names — then
// once more until the committed output covers the input, stops it with
// SIGTERM, and returns the oracle's report.
func (e *jetlEnv) run(t *testing.T, rng *rand.Rand, plan []string, faults string) *etl.Report {
	t.Helper()
	interval := func() time.Duration { return time.Duration(100+rng.IntN(200)) * time.Millisecond }
	for i, spec := range plan {
		ch := e.start(t, spec, faults, interval())
		var err error
		if spec != "" {
			select {
			case err = <-ch.done:
			case <-time.After(90 * time.Second):
				t.Fatalf("run %d: the child never reached %s\n%s", i, spec, ch.out.String())
			}
		} else {
			// The child needs a few seconds to start under the race
			// detector: wait for some output of this run first.
			before, _ := e.committed(t)
			deadline := time.Now().Add(90 * time.Second)
			for out, _ := e.committed(t); out == before && out < e.valid && time.Now().Before(deadline); out, _ = e.committed(t) {
				select {
				case err := <-ch.done:
					t.Fatalf("run %d: the child ended on its own: %v\n%s", i, err, ch.out.String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			select {
			case err = <-ch.done:
			case <-time.After(time.Duration(rng.Int64N(int64(cmp.Or(e.killMax, 300*time.Millisecond))))):
				_ = ch.cmd.Process.Signal(syscall.SIGKILL)
				err = <-ch.done
			}
		}
		if !jetlKilled(err) {
			t.Fatalf("run %d (%q): child ended without being killed: %v\n%s", i, spec, err, ch.out.String())
		}
		out, dlq := e.committed(t)
		t.Logf("run %d killed (%s): %d outputs, %d dead letters committed%s", i, cmpOrStr(spec, "random moment"), out, dlq, restoreLines(ch.out.String()))
	}
	ch := e.start(t, "", faults, interval())
	deadline := time.Now().Add(150 * time.Second)
	for {
		out, dlq := e.committed(t)
		if out >= e.valid && dlq >= e.invalid && strings.Contains(ch.out.String(), jetlChildReady) && e.complete(t, faults) {
			break
		}
		select {
		case err := <-ch.done:
			t.Fatalf("final run ended on its own: %v\n%s", err, ch.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("final run: %d/%d outputs, %d/%d dead letters committed\n%s", out, e.valid, dlq, e.invalid, ch.out.String())
		}
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-ch.done:
		if err != nil {
			t.Fatalf("final run on SIGTERM: %v\n%s", err, ch.out.String())
		}
	case <-time.After(60 * time.Second):
		_ = ch.cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, in its output
		<-ch.done
		t.Fatalf("final run did not stop within 60 s of SIGTERM\n%s", ch.out.String())
	}
	t.Logf("final run%s", restoreLines(ch.out.String()))
	ctx := bg(t, time.Minute)
	out, err := etl.ReadAll(ctx, e.c, e.out)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := etl.ReadAll(ctx, e.c, e.dlq)
	if err != nil {
		t.Fatal(err)
	}
	e.read = out
	return etl.Verify(e.samples, out, dlq)
}

// restoreLines returns the sink's restore log lines of a child's output,
// each on a line of its own.
func restoreLines(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "rocketmq sink: restore") {
			b.WriteString("\n\t")
			b.WriteString(l)
		}
	}
	return b.String()
}

func cmpOrStr(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// TestJavaBrokerETLExactlyOnce (E1 on Apache RocketMQ's broker):
// examples/etl's job in one process over a few thousand orders (2 %
// invalid) on the Java broker, SIGKILLed four times (at random moments,
// and a few milliseconds into a commit, END_TRANSACTIONs in flight) and
// restarted each time; the oracle reads the committed output and finds
// every valid order exactly once, in each customer's order with the right
// running count, and every invalid one in the dead-letter topic once. The
// Java broker stores a half message again for every repeated
// END_TRANSACTION commit (TestJavaBrokerEndTransactionRepeat), so the
// restores must not commit again what the killed run committed.
func TestJavaBrokerETLExactlyOnce(t *testing.T) {
	for _, v := range []string{javapeer.Version5, javapeer.Version4} {
		t.Run(v, func(t *testing.T) {
			_, jc := javaCluster(t, v)
			awaitRegistered(t, jc)
			seed := uint64(time.Now().UnixNano())
			e := newJETLEnv(t, jc, 6000, seed)
			start := time.Now()
			r := e.run(t, rand.New(rand.NewPCG(seed, 21)), []string{"", "commit-mid:2", "", "commit-ended:2"}, "")
			t.Logf("seed %d: %s (%v)", seed, r, time.Since(start).Round(time.Millisecond))
			if !r.OK() {
				t.Fatalf("seed %d: exactly-once violated on Apache RocketMQ %s: %s\n%s", seed, v, r, strings.Join(r.Examples, "\n"))
			}
		})
	}
}

// TestJavaBrokerETLControl proves the kill test can fail on the Java
// broker: with the sink's restore committing the restored checkpoint's
// half messages again without looking for what the killed run committed
// (failpoint.Tx.BlindRestoreCommit), a kill once a commit's END_TRANSACTIONs
// were all answered duplicates that commit's records.
func TestJavaBrokerETLControl(t *testing.T) {
	_, jc := javaCluster(t, javapeer.Version5)
	awaitRegistered(t, jc)
	seed := uint64(time.Now().UnixNano())
	e := newJETLEnv(t, jc, 2000, seed)
	r := e.run(t, rand.New(rand.NewPCG(seed, 21)), []string{"commit-ended:3", "commit-ended:3"}, "blind-restore")
	if r.Duplicated+r.DLQDuplicated == 0 {
		t.Fatalf("seed %d: the blind restore duplicated nothing: the kill test cannot fail (%s)", seed, r)
	}
	t.Logf("control failed the oracle as it must: %s", r)
}
