package rocketmq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
)

func lockClient(t testing.TB, cl *cluster, instance string) *client.Client {
	t.Helper()
	c, err := client.New(client.WithNameServers(cl.ns), client.WithClientIP(netip.MustParseAddr("127.0.0.1")),
		client.WithInstanceName(instance))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestQueueLocksFence: a second source of the same group waits for the
// locks (and fails with ErrQueueLocked past its wait bound); when the first
// one's broker locks lapse and the second takes them, the first one's
// split fails with ErrQueueLockLost instead of reading on.
func TestQueueLocksFence(t *testing.T) {
	// The broker expires locks after 700 ms, while A renews only every 3 s:
	// A's locks lapse on the broker and B gets them.
	cl := newCluster(t, broker.WithLockExpiry(700*time.Millisecond))
	const topic = "fenced"
	cl.createTopic(topic, 2)
	cl.produce(topic, 0, bodies("m", 10)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a, err := New(lockClient(t, cl, "A"), topic, WithQueueLocking(true), WithLockRenewInterval(3*time.Second), WithLockValidity(4*time.Second),
		WithOffsetReporting(false), WithPollTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	splits, err := a.Splits(ctx)
	if err != nil || len(splits) != 2 {
		t.Fatalf("A: Splits = %v, %v", splits, err)
	}
	ra := openSplit(t, a, "broker-a/0", nil)
	if got := readN(t, ra, 10); len(got) != 10 {
		t.Fatalf("A read %d", len(got))
	}

	// C gives up after 200 ms: A's locks are still valid on the broker.
	c, err := New(lockClient(t, cl, "C"), topic, WithQueueLocking(true), WithLockWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Splits(ctx); !errors.Is(err, ErrQueueLocked) {
		t.Fatalf("C: Splits = %v, want ErrQueueLocked", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// B waits until the broker lets A's locks expire, then owns the queues.
	b, err := New(lockClient(t, cl, "B"), topic, WithQueueLocking(true), WithOffsetReporting(false),
		WithLockRenewInterval(200*time.Millisecond), WithLockValidity(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Splits(ctx); err != nil {
		t.Fatalf("B: Splits = %v", err)
	}
	// A's next renewal is refused: its split is fenced.
	testutil.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		pctx, pcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer pcancel()
		_, err := ra.Poll(pctx, 10)
		if errors.Is(err, ErrQueueLockLost) {
			return nil
		}
		return fmt.Errorf("A's Poll = %v, want ErrQueueLockLost", err)
	})
	rb := openSplit(t, b, "broker-a/0", nil)
	if got := readN(t, rb, 10); len(got) != 10 {
		t.Fatalf("B read %d", len(got))
	}
}

const (
	lockChildEnv = "RUNNEL_TEST_LOCK_CHILD" // checkpoint directory of the child job
	lockNSEnv    = "RUNNEL_TEST_LOCK_NS"
	lockTopic    = "locked_job"
)

// lockChild is a job process for TestQueueLocksAcrossProcesses: it reads
// lockTopic with queue locks through a Dial source (whose client the job
// names after itself and its checkpoint directory, taken from the
// environment), prints RUNNING once its tasks run and runs until killed.
func lockChild() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	src, err := Dial(lockTopic, []client.Option{client.WithNameServers(os.Getenv(lockNSEnv)), client.WithClientIP(netip.MustParseAddr("127.0.0.1"))},
		WithQueueLocking(true), WithOffsetReporting(false), WithLogger(log))
	if err != nil {
		fmt.Fprintln(os.Stderr, "ERROR:", err)
		return 1
	}
	defer src.Close()
	job := pipeline.New("lock-child", pipeline.CheckpointDir(os.Getenv(lockChildEnv)), pipeline.CheckpointInterval(100*time.Millisecond))
	pipeline.To(pipeline.FromSource(job, "in", src), "out", sink.NewFunc(func(context.Context, Message) error { return nil }, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if job.Status().State == "running" {
				fmt.Println("RUNNING")
				return
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
	})
	err = job.Run(ctx)
	cancel()
	wg.Wait()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ERROR:", err)
		return 1
	}
	return 0
}

// jobProc is a child job process.
type jobProc struct {
	cmd     *exec.Cmd
	running chan struct{} // closed when it printed RUNNING
	mu      sync.Mutex
	stderr  strings.Builder
	done    chan struct{}
}

func startJobProc(t *testing.T, ns, dir string) *jobProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir, lockNSEnv+"="+ns)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &jobProc{cmd: cmd, running: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "RUNNING" {
				close(p.running)
			}
		}
	})
	wg.Go(func() {
		buf := make([]byte, 4096)
		for {
			n, err := errPipe.Read(buf)
			p.mu.Lock()
			p.stderr.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *jobProc) kill() {
	_ = p.cmd.Process.Kill() // SIGKILL
	<-p.done
}

func (p *jobProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// TestQueueLocksAcrossProcesses: a second job process on the same topic and
// group (the job's name) is blocked by the first one's queue locks; after
// kill -9 of the first, a restart on the same checkpoint directory — whose
// Dial source gives its client the same instance name by itself —
// re-acquires the locks at once, long before the broker's 60 s expiry,
// while the second process (another directory) stays blocked.
func TestQueueLocksAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns job processes")
	}
	cl := newCluster(t)
	cl.createTopic(lockTopic, 2)
	cl.produce(lockTopic, 0, bodies("m", 10)...)
	first := filepath.Join(t.TempDir(), "dir-1")
	a := startJobProc(t, cl.ns, first)
	select {
	case <-a.running:
	case <-a.done:
		t.Fatalf("first job exited: %s", a.log())
	case <-time.After(20 * time.Second):
		t.Fatalf("first job not running: %s", a.log())
	}
	b := startJobProc(t, cl.ns, filepath.Join(t.TempDir(), "dir-2"))
	// The second one must log that it waits and must not start.
	testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(b.log(), "waiting for broker queue locks") {
			return fmt.Errorf("second job does not report waiting for the locks: %s", b.log())
		}
		return nil
	})
	select {
	case <-b.running:
		t.Fatal("second job runs while the first holds the queue locks")
	case <-b.done:
		t.Fatalf("second job exited: %s", b.log())
	default:
	}

	a.kill()
	// The dead process's locks still block the second one (it retries at
	// least every 2 s; the broker keeps them for 60 s).
	select {
	case <-b.running:
		t.Fatal("second job got the locks of the killed one")
	case <-b.done:
		t.Fatalf("second job exited: %s", b.log())
	case <-time.After(3 * time.Second):
	}
	start := time.Now()
	a2 := startJobProc(t, cl.ns, first)
	select {
	case <-a2.running:
	case <-a2.done:
		t.Fatalf("restarted job exited: %s", a2.log())
	case <-time.After(20 * time.Second):
		t.Fatalf("restarted job did not re-acquire its locks: %s", a2.log())
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("restart took %v to re-acquire the locks", d)
	}
	select {
	case <-b.running:
		t.Fatal("second job runs although the restarted first one holds the locks")
	default:
	}
}
