package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
)

// The keyed-count crash child (crash_test.go) also serves its status
// endpoint (its address written to the file envSPStatus names), retains
// its last 3 checkpoints, and restores from envSPRestore when set.
const (
	envSPStatus  = "RUNNEL_E2E_SP_STATUS"
	envSPRestore = "RUNNEL_E2E_SP_RESTORE"
)

func savepointChildOptions() []pipeline.JobOption {
	var opts []pipeline.JobOption
	if f := os.Getenv(envSPStatus); f != "" {
		opts = append(opts, pipeline.RetainCheckpoints(3, 0), pipeline.StatusAddress("127.0.0.1:0", func(addr string) {
			if err := os.WriteFile(f+".tmp", []byte(addr), 0o644); err == nil {
				err = os.Rename(f+".tmp", f)
			}
		}))
	}
	if r := os.Getenv(envSPRestore); r != "" {
		opts = append(opts, pipeline.RestoreFrom(r))
	}
	return opts
}

func postSavepoint(ctx context.Context, addr string, stop bool) (runtime.SavepointResult, error) {
	var res runtime.SavepointResult
	url := "http://" + addr + "/savepoint"
	if stop {
		url += "?stop=true"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return res, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("POST /savepoint: %s", resp.Status)
	}
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

func completedAfter(ctx context.Context, addr string, id uint64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var st struct {
		Checkpoints []runtime.CheckpointStatus `json:"checkpoints"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return err
	}
	for _, c := range st.Checkpoints {
		if c.ID > id && c.Result == "completed" {
			return nil
		}
	}
	return fmt.Errorf("no checkpoint after %d completed yet", id)
}

// runSavepointKill runs the keyed-count child, takes a savepoint of it
// while it runs, waits until a later checkpoint completed (the job's latest
// is past the savepoint), SIGKILLs it, and runs it to the end restored from
// pick(dir, savepoint id) (a savepoint or a retained checkpoint id). It
// returns the per-key counts in the KV sink.
func runSavepointKill(t *testing.T, control bool, pick func(t *testing.T, dir string, sp uint64) string) map[uint64]int64 {
	t.Helper()
	dir := t.TempDir()
	statusFile := filepath.Join(dir, "status-addr")
	start := func(restore string) *exec.Cmd {
		env := []string{envChild + "=1", envDir + "=" + dir, envPar + "=2", envSPStatus + "=" + statusFile}
		if restore != "" {
			env = append(env, envSPRestore+"="+restore)
		}
		return startChildTest(t, "^$", control, envControl, env...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := start("")
	var addr string
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		b, err := os.ReadFile(statusFile)
		addr = string(b)
		return err
	})
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error { return completedAfter(ctx, addr, 2) })
	sp, err := postSavepoint(ctx, addr, false)
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error { return completedAfter(ctx, addr, sp.ID+1) })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !killedBy(err, syscall.SIGKILL) {
		t.Fatalf("the child was not killed: %v", err)
	}
	s, err := checkpoint.Open(filepath.Join(dir, "job"), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	latest, _ := s.Latest()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if latest.ID <= sp.ID+1 {
		t.Fatalf("killed at checkpoint %d, not past the savepoint %d", latest.ID, sp.ID)
	}
	spec := pick(t, filepath.Join(dir, "job"), sp.ID)
	t.Logf("savepoint %d (%d bytes); killed at checkpoint %d; restoring %s", sp.ID, sp.Bytes, latest.ID, spec)
	cmd = start(spec)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("restored run: %v", err)
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("restored run did not finish")
	}
	return readCounts(t, filepath.Join(dir, "kv"))
}

func pickSavepoint(_ *testing.T, _ string, sp uint64) string { return strconv.FormatUint(sp, 10) }

// pickOldestRetained picks the oldest retained checkpoint (older than the
// latest the kill left).
func pickOldestRetained(t *testing.T, dir string, _ uint64) string {
	points, err := checkpoint.ListRestorePoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	var oldest uint64
	for _, p := range points {
		if p.Kind == checkpoint.KindRetained {
			oldest = p.ID
		}
	}
	if oldest == 0 {
		t.Fatalf("no retained checkpoint in %v", points)
	}
	return strconv.FormatUint(oldest, 10)
}

// TestE2ESavepointKillRestore: a savepoint of the running keyed-count job
// (POST /savepoint), the job SIGKILLed after later checkpoints completed,
// then restored from the savepoint (back past those checkpoints): the KV
// sink's per-key counts are exact. Control: with offsets checkpointed
// behind the state (Faults.OffsetsBeforeState) the savepoint is no
// consistent cut and the counts come out wrong.
func TestE2ESavepointKillRestore(t *testing.T) {
	got := runSavepointKill(t, false, pickSavepoint)
	if n, ex := diffCounts(got, expectedCounts()); n != 0 {
		t.Fatalf("%d keys differ after the restore from the savepoint (%s)", n, ex)
	}
}

func TestE2ESavepointKillRestoreControl(t *testing.T) {
	got := runSavepointKill(t, true, pickSavepoint)
	n, ex := diffCounts(got, expectedCounts())
	if n == 0 {
		t.Fatal("the faulty job passed the check: it cannot fail")
	}
	t.Logf("control failed the check as it must: %d keys differ (%s)", n, ex)
}

// TestE2ERetainedRestore: the same with the oldest of the 3 retained
// checkpoints the kill left (older than the latest): exact counts.
func TestE2ERetainedRestore(t *testing.T) {
	got := runSavepointKill(t, false, pickOldestRetained)
	if n, ex := diffCounts(got, expectedCounts()); n != 0 {
		t.Fatalf("%d keys differ after the restore from a retained checkpoint (%s)", n, ex)
	}
}

// TestE2EETLStopWithSavepoint: examples/etl (exactly-once RocketMQ sinks)
// stopped with a savepoint mid-input (POST /savepoint?stop=true: Run
// returns nil after the sinks committed; only the first half of the input
// is there until then, so that the stop cannot come after the end), then
// resumed from that savepoint by id (-restore) to the end: every valid order exactly once, each
// customer's running count exact (the E1 oracle). Restoring the same
// savepoint once more, now that output past it is committed, fails with
// sink.ErrOutputAhead (the documented refusal), writing nothing. (The
// oracle's own control is TestE2EETLControl.)
func TestE2EETLStopWithSavepoint(t *testing.T) {
	const n = 20_000
	e := newETLEnv(t, n, testSeed(t))
	e.produce(t, 0, n/2)
	dir := filepath.Join(t.TempDir(), "job")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addrc := make(chan string, 1)
	base := etl.Config{SingleProcess: true, In: etlIn, Out: etlOut, DLQ: etlDLQ, Group: "etl_sp", StateDir: dir,
		CheckpointInterval: 200 * time.Millisecond, Parallelism: 2, StatusAddr: "127.0.0.1:0", OnStatusAddr: func(a string) {
			select {
			case addrc <- a:
			default:
			}
		}}
	run := func(cfg etl.Config) chan error {
		done := make(chan error, 1)
		go func() { done <- etl.Run(ctx, e.c, cfg) }()
		return done
	}
	valid, invalid := e.expected()
	done := run(base)
	addr := <-addrc
	testutil.CheckFor(t, 60*time.Second, 2*time.Millisecond, func() error {
		if out, _ := e.committed(t); out < valid/10 {
			return fmt.Errorf("%d of %d committed", out, valid)
		}
		return nil
	})
	sp, err := postSavepoint(ctx, addr, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("stop with savepoint: Run returned %v", err)
	}
	out, dlq := e.committed(t)
	t.Logf("stopped with savepoint %d (%d bytes): %d of %d outputs, %d of %d dead letters committed", sp.ID, sp.Bytes, out, valid, dlq, invalid)
	if out >= valid {
		t.Fatalf("the job read everything before the savepoint: the test does not test a resume")
	}
	e.produce(t, n/2, n)
	resume := base
	resume.Restore = strconv.FormatUint(sp.ID, 10)
	cctx, stop := context.WithCancel(ctx)
	done = make(chan error, 1)
	go func() { done <- etl.Run(cctx, e.c, resume) }()
	<-addrc
	testutil.CheckFor(t, 90*time.Second, 20*time.Millisecond, func() error {
		if out, dlq := e.committed(t); out < valid || dlq < invalid {
			return fmt.Errorf("%d of %d outputs, %d of %d dead letters", out, valid, dlq, invalid)
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("resumed run: %v", err)
	}
	if r := e.verify(t); !r.OK() {
		t.Fatalf("exactly-once violated after stop-with-savepoint and resume: %s\n%s", r, strings.Join(r.Examples, "\n"))
	}
	// The savepoint again (by its file: a new spec): output past it is
	// committed, so the restore check refuses it.
	again := base
	again.Restore = sp.Path
	err = <-run(again)
	if !errors.Is(err, sink.ErrOutputAhead) {
		t.Fatalf("restoring the savepoint behind committed output: %v, want sink.ErrOutputAhead", err)
	}
	t.Logf("refused as documented: %v", err)
	if r := e.verify(t); !r.OK() {
		t.Fatalf("the refused restore wrote output: %s", r)
	}
}
