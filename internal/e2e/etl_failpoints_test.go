package e2e

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/broker"
)

// TestE2EETLFailpoints (E2, make test-failpoints: RUNNEL_FAILPOINT_MATRIX=1
// and the failpoints build tag) is
// the failpoint matrix of the exactly-once ETL: for each boundary of the
// protocol the job is SIGKILLed there N times (20; 3 with -short), each time
// restarted on the same state; then a final run completes, the broker's
// half messages all end (committed, or rolled back by check-back answers),
// and the oracle finds 0 lost and 0 duplicated records.
//
// Boundaries: after a half message was acknowledged (half-sent); while the
// checkpoint batch is written (checkpoint-batch: within 1.5 ms after the
// pre-commit returned); after the checkpoint is durable, before any
// END_TRANSACTION (commit-start); after every END_TRANSACTION, before the
// sink's bookkeeping (commit-ended); inside the restore's commit
// (recover-commit); while answering a check-back (check-back; the runs in
// between are killed after a half send, leaving orphans to check back).
func TestE2EETLFailpoints(t *testing.T) {
	if os.Getenv("RUNNEL_FAILPOINT_MATRIX") == "" {
		t.Skip("the failpoint matrix runs with make test-failpoints (RUNNEL_FAILPOINT_MATRIX=1)")
	}
	requireFailpoints(t)
	runs := 20
	if testing.Short() {
		runs = 3
	}
	for _, boundary := range []string{"half-sent", "checkpoint-batch", "commit-start", "commit-ended", "recover-commit", "check-back"} {
		t.Run(boundary, func(t *testing.T) {
			seed := testSeed(t)
			e := startETLEnv(t, 4_000, seed, broker.WithTransactionTimeout(300*time.Millisecond),
				broker.WithTransactionCheckInterval(100*time.Millisecond), broker.WithTransactionCheckMax(1_000_000))
			dir := t.TempDir()
			o := etlRunOpts{dir: dir, interval: 50 * time.Millisecond, par: 1}
			for i := range runs {
				spec := boundary + ":" + strconv.Itoa(1+i%3)
				switch {
				case i == 0 && boundary == "recover-commit":
					spec = "commit-ended:2" // leaves a durable checkpoint whose transaction the next restore commits
				case boundary == "check-back" && i%2 == 0:
					spec = "half-sent:" + strconv.Itoa(20+i)
				case boundary == "recover-commit", boundary == "check-back":
					spec = boundary + ":1"
				}
				o.kill = spec
				ch := e.startChild(t, o)
				var err error
				select {
				case err = <-ch.done:
				case <-time.After(60 * time.Second):
					_ = ch.cmd.Process.Kill()
					<-ch.done
					t.Fatalf("run %d: never reached %s\n%s", i, spec, ch.out.String())
				}
				if !killedBy(err, syscall.SIGKILL) || !strings.Contains(ch.out.String(), "SIGKILL at "+spec) {
					t.Fatalf("run %d: not killed at %s: %v\n%s", i, spec, err, ch.out.String())
				}
			}
			o.kill = ""
			r := e.finish(t, o, true)
			st := e.b.TransactionStats()
			t.Logf("%s × %d: %s; broker %+v", boundary, runs, r, st)
			if !r.OK() {
				t.Fatalf("seed %d: %s\n%s", seed, r, strings.Join(r.Examples, "\n"))
			}
			if st.Prepared != st.Committed+st.RolledBack || st.Discarded != 0 {
				t.Fatalf("half messages not all ended: %+v", st)
			}
		})
	}
}
