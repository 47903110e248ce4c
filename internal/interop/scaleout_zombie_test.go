package interop

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// owners returns, for every task of the ETL job (8 source queues, 8
// key-group ranges), the worker that wrote its latest commit record, as a
// follower reading the job's commit chains sees it now.
func (e *soEnv) owners(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := scaleout.NewFollower(e.c, soJob, nil)
	defer func() { _ = f.Close() }()
	var ids []string
	for _, stage := range []string{etl.UIDSource, etl.UIDEnrich} {
		topic := scaleout.TopicName(soJob, stage, scaleout.KindCommit)
		for q := range int32(8) {
			id := scaleout.TaskID{Stage: stage, Broker: testutil.BrokerName, Queue: q}.String()
			f.Follow(id, protocol.MessageQueue{Topic: topic, BrokerName: testutil.BrokerName, QueueID: q})
			ids = append(ids, id)
		}
	}
	out := map[string]string{}
	for _, id := range ids {
		if err := f.Ready(ctx, id); err != nil {
			t.Fatal(err)
		}
		v, err := f.View(id)
		if err != nil {
			t.Fatal(err)
		}
		if v.Latest != nil {
			out[id] = v.Latest.Worker
		}
	}
	return out
}

func workerID(name string) string { return "127.0.0.1@" + name }

// TestScaleoutZombie: worker A is paused (SIGSTOP) past its client's and
// locks' expiry; worker B takes its tasks and commits; A is resumed
// (SIGCONT): whatever A had in flight or tries to commit afterwards is
// fenced by B's claims (A's commit records are invalid for every reader,
// its sink transactions roll back), so the oracle finds every order exactly
// once. The control takes both of A's fences away: a publish counts
// without reading its commit chain back, and a task whose queue lock was
// lost goes on running (with only the first, the lock check stopped the
// resumed A before its next commit in most runs, so that the control
// failed only when A resumed inside a commit). The resumed A then commits
// its stale epoch's output on top of B's, and the oracle must find the
// duplicates.
func TestScaleoutZombie(t *testing.T) {
	if raceEnabled {
		runWithoutRace(t, "^TestScaleoutZombie$")
		return
	}
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) { testScaleoutZombie(t, control) })
	}
}

func testScaleoutZombie(t *testing.T, control bool) {
	mode := ""
	if control {
		requireFailpoints(t)
		mode = "skip-confirm"
	}
	// A paused client expires after 3 s, its locks after 2 s. Half
	// messages are checked back after a minute, not newSOEnv's second: the
	// pause is longer than that, and a check-back (answered by B from the
	// commit chain) would roll back A's in-flight halves before A resumes,
	// so that even the control's unconfirmed commits would find nothing to
	// commit; here A's own protocol alone must fence it.
	e := newSOEnv(t, 40_000, testSeedSO(t), mode, broker.WithClientExpiry(3*time.Second, 250*time.Millisecond),
		broker.WithLockExpiry(2*time.Second), broker.WithTransactionTimeout(time.Minute))
	dirs := []string{e.newDir(), e.newDir()}
	workers := []*soChild{e.start("zA", dirs[0], ""), e.start("zB", dirs[1], "")}
	defer stopAll(workers)
	a := workers[0]
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if o, _ := e.committed(); o < 2000 {
			return fmt.Errorf("%d outputs committed", o)
		}
		own := e.owners(t)
		n := 0
		for _, w := range own {
			if w == workerID("zA") {
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("A owns no task yet: %v", own)
		}
		return nil
	})
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// B takes every task once A's client expires.
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		for id, w := range e.owners(t) {
			if w != workerID("zB") {
				return fmt.Errorf("task %s still owned by %s", id, w)
			}
		}
		return nil
	})
	took := time.Since(stopped)
	before, _ := e.committed()
	// B commits for a while as the only owner.
	testutil.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		if o, _ := e.committed(); o < before+2000 && o < e.valid {
			return fmt.Errorf("%d outputs", o)
		}
		return nil
	})
	t.Logf("A paused: B owned every task after %v; resuming A after %v", took.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r, bad := e.finish(workers, dirs)
	t.Logf("oracle: %s", r)
	fenced := strings.Count(a.out.String(), "fenced") + strings.Count(a.out.String(), "queue lock lost")
	if control {
		if bad == 0 {
			t.Fatalf("control: a worker trusting its late commits went unnoticed by the oracle (%s)", r)
		}
		t.Logf("control failed the oracle as it must: %s\n%s", r, strings.Join(r.Examples, "\n"))
		return
	}
	if bad != 0 {
		t.Fatalf("oracle: %s\n%s", r, strings.Join(r.Examples, "\n"))
	}
	if fenced == 0 {
		t.Fatalf("the resumed worker never noticed it had been fenced\n%s", a.out.String())
	}
	t.Logf("the resumed worker stopped %d stale task runs (lost locks or fenced commits)", fenced)
}

// TestScaleoutScale131: the ETL job starts on one worker, two more join
// during the run and leave again (SIGTERM) before it ends: the output is
// exact, and every task ends on the remaining worker.
func TestScaleoutScale131(t *testing.T) {
	if raceEnabled {
		runWithoutRace(t, "^TestScaleoutScale131$")
		return
	}
	e := newSOEnv(t, 60_000, testSeedSO(t), "")
	dirs := []string{e.newDir(), e.newDir(), e.newDir()}
	workers := []*soChild{e.start("s1", dirs[0], ""), nil, nil}
	defer stopAll(workers)
	waitOutputs := func(n int64) {
		t.Helper()
		testutil.CheckFor(t, 120*time.Second, 50*time.Millisecond, func() error {
			if o, _ := e.committed(); o < n {
				return fmt.Errorf("%d of %d outputs", o, n)
			}
			return nil
		})
	}
	waitOutputs(3000)
	workers[1], workers[2] = e.start("s2", dirs[1], ""), e.start("s3", dirs[2], "")
	// All three share the tasks...
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		seen := map[string]bool{}
		for _, w := range e.owners(t) {
			seen[w] = true
		}
		if len(seen) != 3 {
			return fmt.Errorf("owners %v", seen)
		}
		return nil
	})
	o, _ := e.committed()
	t.Logf("three workers own the tasks at %d outputs", o)
	waitOutputs(o + 5000)
	// ...then two leave.
	for _, i := range []int{1, 2} {
		_ = workers[i].cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-workers[i].done:
			if err != nil {
				t.Fatalf("worker %s on SIGTERM: %v\n%s", workers[i].name, err, workers[i].out.String())
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("worker %s did not stop", workers[i].name)
		}
		workers[i] = nil
	}
	o, _ = e.committed()
	t.Logf("back to one worker at %d outputs", o)
	r, bad := e.finish(workers, dirs)
	t.Logf("oracle: %s", r)
	if bad != 0 {
		t.Fatalf("oracle: %s\n%s", r, strings.Join(r.Examples, "\n"))
	}
	for id, w := range e.owners(t) {
		if w != workerID("s1") {
			t.Fatalf("task %s ended on %s, not on the remaining worker", id, w)
		}
	}
}
