package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
)

// The ETL crash tests re-execute this test binary, running only
// TestETLChild, as the job process (examples/etl's job, etl.Run); these
// variables carry its setup.
const (
	envETLChild    = "RUNNEL_E2E_ETL_CHILD"
	envETLNamesrv  = "RUNNEL_E2E_ETL_NAMESRV"
	envETLDir      = "RUNNEL_E2E_ETL_DIR"
	envETLControl  = "RUNNEL_E2E_ETL_CONTROL"
	envETLKill     = "RUNNEL_E2E_ETL_KILL"     // "phase:n": SIGKILL itself at the n-th occurrence of phase
	envETLWindow   = "RUNNEL_E2E_ETL_WINDOW"   // discard window given to the sinks
	envETLInterval = "RUNNEL_E2E_ETL_INTERVAL" // checkpoint interval
	envETLPar      = "RUNNEL_E2E_ETL_PARALLELISM"

	etlIn  = "orders"
	etlOut = "orders-enriched"
	etlDLQ = "orders-dlq"
)

// killPhases are the phases a child can be told to die in: the sink's
// phases, plus "commit-mid" (a few milliseconds into a commit, while
// END_TRANSACTIONs are in flight) and "checkpoint-batch" (right after a
// pre-commit returned, while the checkpoint batch is being written).
var killPhases = map[string]mqsink.Phase{
	"half-sent": mqsink.PhaseHalfSent, "pre-committed": mqsink.PhasePreCommitted, "commit-start": mqsink.PhaseCommitStart,
	"commit-ended": mqsink.PhaseCommitEnded, "recover-commit": mqsink.PhaseRecoverCommit, "check-back": mqsink.PhaseCheckBack,
	"commit-mid": mqsink.PhaseCommitStart, "checkpoint-batch": mqsink.PhasePreCommitted,
}

func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never continue past the kill point
}

// killHook returns the phase hook that SIGKILLs the process at the n-th
// occurrence of the phase named by spec ("phase:n"), or nil.
func killHook(spec string) func(mqsink.Phase, uint64) {
	name, ns, ok := strings.Cut(spec, ":")
	if !ok {
		return nil
	}
	want, ok := killPhases[name]
	n, err := strconv.Atoi(ns)
	if !ok || err != nil {
		panic("bad " + envETLKill + " " + spec)
	}
	var hits atomic.Int64
	return func(p mqsink.Phase, _ uint64) {
		if p != want || hits.Add(1) != int64(n) {
			return
		}
		fmt.Fprintf(os.Stderr, "etl child: SIGKILL at %s\n", spec)
		switch name {
		case "commit-mid":
			time.AfterFunc(time.Duration(1+rand.IntN(3))*time.Millisecond, killSelf)
		case "checkpoint-batch":
			time.AfterFunc(time.Duration(rand.IntN(1500))*time.Microsecond, killSelf)
		default:
			killSelf()
		}
	}
}

// etlChildReady is the line a TestETLChild process prints once it handles
// SIGTERM (a SIGTERM before that kills it).
const etlChildReady = "etl-child: ready"

// TestETLChild is the job process of the ETL crash tests (it does nothing
// unless started by them): examples/etl's job on the parent's broker until
// SIGTERM.
func TestETLChild(t *testing.T) {
	if os.Getenv(envETLChild) == "" {
		t.Skip("only run as the child of the ETL crash tests")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println(etlChildReady) // SIGTERM is handled from here on
	c, err := newMQClient(os.Getenv(envETLNamesrv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	interval, err := time.ParseDuration(os.Getenv(envETLInterval))
	if err != nil {
		t.Fatal(err)
	}
	par, _ := strconv.Atoi(os.Getenv(envETLPar))
	var opts []mqsink.TxOption
	if h := killHook(os.Getenv(envETLKill)); h != nil {
		opts = append(opts, phaseHook(h)...)
	}
	if w := os.Getenv(envETLWindow); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, mqsink.WithDiscardWindow(d))
	}
	if os.Getenv(envETLControl) != "" {
		opts = append(opts, txFaults(failpoint.Tx{CommitBeforeDurable: true})...)
	}
	err = etl.Run(ctx, c, etl.Config{SingleProcess: true, In: etlIn, Out: etlOut, DLQ: etlDLQ, Group: "etl_e2e", StateDir: filepath.Join(os.Getenv(envETLDir), "job"),
		CheckpointInterval: interval, Parallelism: par, SinkOptions: opts,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
}

// etlEnv is the parent's broker with the ETL topics and input.
type etlEnv struct {
	ns      *namesrv.Server
	b       *broker.Broker
	c       *client.Client
	samples []etl.Sample
}

func startETLEnv(t *testing.T, n int, seed uint64, bopts ...broker.Option) *etlEnv {
	t.Helper()
	e := newETLEnv(t, n, seed, bopts...)
	e.produce(t, 0, n)
	return e
}

// produce sends samples [from, to) to the input topic, in order.
func (e *etlEnv) produce(t *testing.T, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	if err := preloadSamples(ctx, e, e.samples[from:to]); err != nil {
		t.Fatal(err)
	}
	t.Logf("produced orders [%d, %d) in %v", from, to, time.Since(start).Round(time.Millisecond))
}

// newETLEnv is startETLEnv without the input: the n samples are drawn but
// not produced.
func newETLEnv(t *testing.T, n int, seed uint64, bopts ...broker.Option) *etlEnv {
	t.Helper()
	cl := testutil.RunCluster(t, bopts...)
	ns, b := cl.Embedded.Namesrv(), cl.Broker
	c, err := newMQClient(ns.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	e := &etlEnv{ns: ns, b: b, c: c}
	for _, tp := range []struct {
		name string
		n    int
	}{{etlIn, 4}, {etlOut, 4}, {etlDLQ, 2}} {
		(&mqEnv{ns: ns, b: b, c: c}).createTopic(t, tp.name, tp.n)
	}
	e.samples = etl.SampleOrders(n, 1000, 100, seed)
	return e
}

// expected returns the numbers of valid and invalid samples.
func (e *etlEnv) expected() (valid, invalid int64) {
	for i := range e.samples {
		if e.samples[i].Valid {
			valid++
		} else {
			invalid++
		}
	}
	return valid, invalid
}

// etlChild is one run of the child job.
type etlChild struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error
}

type etlRunOpts struct {
	dir      string
	control  bool
	kill     string // phase spec
	window   time.Duration
	interval time.Duration
	par      int
}

func (e *etlEnv) startChild(t *testing.T, o etlRunOpts) *etlChild {
	t.Helper()
	if o.kill != "" || o.control {
		requireFailpoints(t)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestETLChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envETLChild+"=1", envETLDir+"="+o.dir, envETLNamesrv+"="+e.ns.Addr(),
		envETLInterval+"="+o.interval.String(), envETLPar+"="+strconv.Itoa(max(o.par, 1)), envETLKill+"="+o.kill)
	if o.control {
		cmd.Env = append(cmd.Env, envETLControl+"=1")
	}
	if o.window > 0 {
		cmd.Env = append(cmd.Env, envETLWindow+"="+o.window.String())
	}
	ch := &etlChild{cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = ch.out, ch.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { ch.done <- cmd.Wait() }()
	return ch
}

// killedBy reports whether the child's exit error is a SIGKILL.
func killedBy(err error, sig syscall.Signal) bool {
	ee, ok := err.(*exec.ExitError)
	if !ok {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// committed returns the committed output and dead-letter counts.
func (e *etlEnv) committed(t *testing.T) (out, dlq int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := etl.Count(ctx, e.c, etlOut)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err = etl.Count(ctx, e.c, etlDLQ)
	if err != nil {
		t.Fatal(err)
	}
	return out, dlq
}

// finish runs the child until the committed output covers the input (or
// more: duplicates), optionally until every half message ended, then stops
// it with SIGTERM (a final checkpoint) and returns the oracle's report.
func (e *etlEnv) finish(t *testing.T, o etlRunOpts, halvesEnded bool) *etl.Report {
	t.Helper()
	valid, invalid := e.expected()
	ch := e.startChild(t, o)
	deadline := time.Now().Add(150 * time.Second)
	for {
		select {
		case err := <-ch.done:
			t.Fatalf("final child run ended on its own: %v\n%s", err, ch.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		out, dlq := e.committed(t)
		done := out >= valid && dlq >= invalid
		if done && halvesEnded {
			st := e.b.TransactionStats()
			done = st.Prepared == st.Committed+st.RolledBack+st.Discarded
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			_ = ch.cmd.Process.Kill()
			<-ch.done
			r := e.verify(t)
			t.Logf("oracle: %s\n%s", r, strings.Join(r.Examples, "\n"))
			t.Fatalf("final run: only %d/%d outputs and %d/%d dead letters committed; broker %+v\n%s", out, valid, dlq, invalid,
				e.b.TransactionStats(), ch.out.String())
		}
	}
	// The outputs may all be there before this run even started (the
	// previous one finished the input): SIGTERM only once the child handles
	// it, or the signal kills it instead of stopping it.
	for !strings.Contains(ch.out.String(), etlChildReady) {
		select {
		case err := <-ch.done:
			t.Fatalf("final child run ended on its own: %v\n%s", err, ch.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("final child run never got ready\n%s", ch.out.String())
		}
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-ch.done; err != nil {
		t.Fatalf("final child run on SIGTERM: %v\n%s", err, ch.out.String())
	}
	return e.verify(t)
}

func (e *etlEnv) verify(t *testing.T) *etl.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := etl.ReadAll(ctx, e.c, etlOut)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := etl.ReadAll(ctx, e.c, etlDLQ)
	if err != nil {
		t.Fatal(err)
	}
	return etl.Verify(e.samples, out, dlq)
}

// runETLKills runs the child kills times, each run killed at a random
// moment (SIGKILL from the parent) or at a protocol phase (the child
// SIGKILLs itself there), and returns the oracle's report after a final
// run.
func runETLKills(t *testing.T, e *etlEnv, seed uint64, kills int, phases []string, control bool) *etl.Report {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 6))
	plan := make([]string, kills) // "" = random moment
	// Never a phase kill first: the first run restores nothing (no
	// recover-commit) and the phases should hit a job with history.
	for i, p := range rng.Perm(kills - 1)[:min(len(phases), kills-1)] {
		plan[p+1] = phases[i]
	}
	for i, phase := range plan {
		if phase != "" {
			n := 1 + rng.IntN(4)
			if phase == "recover-commit" {
				n = 1
			}
			plan[i] = phase + ":" + strconv.Itoa(n)
		}
	}
	return runETLPlan(t, e, rng, plan, control)
}

// runETLPlan runs the child once per entry of plan, killed at a random
// moment ("") or at the phase spec the entry names ("phase:n", the n-th
// time the child reaches it), and returns the oracle's report after a
// final run.
func runETLPlan(t *testing.T, e *etlEnv, rng *rand.Rand, plan []string, control bool) *etl.Report {
	t.Helper()
	dir := t.TempDir()
	opts := func(kill string) etlRunOpts {
		return etlRunOpts{dir: dir, control: control, kill: kill, interval: time.Duration(50+rng.IntN(150)) * time.Millisecond, par: 1 + rng.IntN(2)}
	}
	for i, spec := range plan {
		ch := e.startChild(t, opts(spec))
		var err error
		if spec != "" {
			select {
			case err = <-ch.done:
			case <-time.After(60 * time.Second):
				_ = ch.cmd.Process.Kill()
				<-ch.done
				t.Fatalf("run %d: the child never reached %s\n%s", i, spec, ch.out.String())
			}
		} else {
			delay := time.Duration(300+rng.IntN(1200)) * time.Millisecond
			select {
			case err = <-ch.done:
			case <-time.After(delay):
				_ = ch.cmd.Process.Signal(syscall.SIGKILL)
				err = <-ch.done
			}
		}
		if !killedBy(err, syscall.SIGKILL) {
			t.Fatalf("run %d (%q): child ended without being killed: %v\n%s", i, spec, err, ch.out.String())
		}
		out, dlq := e.committed(t)
		t.Logf("run %d killed (%s): %d outputs, %d dead letters committed", i, cmpOr(spec, "random moment"), out, dlq)
	}
	return e.finish(t, opts(""), false)
}

// TestE2EETLPausedPastDiscardWindow: the job is paused (SIGSTOP) until the
// broker (with a shortened discard window) discarded half messages; once
// resumed it fails loudly (or sends them again), and after a restart the
// oracle finds nothing missing or duplicated.
func TestE2EETLPausedPastDiscardWindow(t *testing.T) {
	seed := testSeed(t)
	// The broker discards a half message about 2 s + 3 × 1 s (+ one scan)
	// after it was stored; the sinks fail an epoch at 3/4 of 5 s.
	e := startETLEnv(t, 20_000, seed, broker.WithTransactionTimeout(2*time.Second),
		broker.WithTransactionCheckInterval(time.Second), broker.WithTransactionCheckMax(3))
	o := etlRunOpts{dir: t.TempDir(), interval: 100 * time.Millisecond, par: 1, window: 5 * time.Second}
	ch := e.startChild(t, o)
	deadline := time.Now().Add(60 * time.Second)
	for out, _ := e.committed(t); out < 200; out, _ = e.committed(t) {
		select {
		case err := <-ch.done:
			t.Fatalf("the job ended before the pause: %v\n%s", err, ch.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress before the pause\n%s", ch.out.String())
		}
		time.Sleep(20 * time.Millisecond) // poll
	}
	if err := ch.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for e.b.TransactionStats().Discarded == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll: the broker discards after ~6 s
	}
	discarded := e.b.TransactionStats().Discarded
	if err := ch.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("paused until the broker discarded %d half messages", discarded)
	var loud bool
	select {
	case err := <-ch.done:
		msg := ch.out.String()
		loud = err != nil && (strings.Contains(msg, "discard window") || strings.Contains(msg, "discarded"))
		if !loud {
			t.Fatalf("the job ended after the pause without a loud failure: %v\n%s", err, msg)
		}
		t.Logf("the job failed loudly after the pause: %v", lastLine(msg, "discard"))
	case <-time.After(5 * time.Second):
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
		if err := <-ch.done; err != nil {
			t.Fatalf("the job survived the pause but failed on SIGTERM: %v\n%s", err, ch.out.String())
		}
		t.Logf("the job survived the pause (it sent discarded records again)")
	}
	r := e.finish(t, o, false)
	t.Logf("seed %d: %s", seed, r)
	if !r.OK() {
		t.Fatalf("seed %d: records silently missing or duplicated after the pause: %s\n%s", seed, r, strings.Join(r.Examples, "\n"))
	}
}

// lastLine returns the last line of s containing sub.
func lastLine(s, sub string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return lines[i]
		}
	}
	return ""
}

func cmpOr(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

func etlSize() (records, kills int, phases []string) {
	phases = []string{"checkpoint-batch", "commit-start", "commit-mid", "recover-commit"}
	switch {
	case testing.Short():
		return 20_000, 3, []string{"pre-committed", "commit-mid"}
	case etlRace:
		// The race detector makes the job ~10x slower: 100k records would
		// not fit the test budget; the kill schedule stays the same.
		return 20_000, 10, phases
	}
	return 100_000, 10, phases
}

// TestE2EETLExactlyOnce (E1): examples/etl's job over 100k orders of 1000
// customers (1 % invalid; 20k under the race detector or -short), SIGKILLed at 10 points — some random, some
// inside the checkpoint and commit phases — and restarted each time; the
// oracle reads only committed output (half messages are invisible) and
// finds every valid order exactly once, each customer's orders in input
// order with the right running count, and every invalid order in the DLQ
// exactly once.
func TestE2EETLExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	n, kills, phases := etlSize()
	e := startETLEnv(t, n, seed)
	start := time.Now()
	r := runETLKills(t, e, seed, kills, phases, false)
	t.Logf("seed %d: %s (%v)", seed, r, time.Since(start).Round(time.Millisecond))
	if !r.OK() {
		t.Fatalf("seed %d: exactly-once violated: %s\n%s", seed, r, strings.Join(r.Examples, "\n"))
	}
	t.Logf("broker transactions: %+v", e.b.TransactionStats())
}

// TestE2EETLControl proves the oracle can fail: with the sink committing
// its half messages before the checkpoint listing them is durable, a kill
// right after the pre-commit replays records whose output is visible.
// Both runs die at their second pre-commit, at once: the first epoch of a
// run may be empty, and a kill some time after the pre-commit (a random
// moment, "checkpoint-batch") can come after the checkpoint is durable,
// when nothing is replayed; the first run cannot have drained the input.
func TestE2EETLControl(t *testing.T) {
	seed := testSeed(t)
	e := startETLEnv(t, 10_000, seed)
	r := runETLPlan(t, e, rand.New(rand.NewPCG(seed, 6)), []string{"pre-committed:2", "pre-committed:2"}, true)
	if r.OK() {
		t.Fatalf("seed %d: the faulty sink passed the oracle: the check cannot fail (%s)", seed, r)
	}
	t.Logf("control failed the oracle as it must: %s", r)
}
