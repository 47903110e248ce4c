package interop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// envHAETLKills overrides the number of master kills of TestHAETLKill.
const envHAETLKills = "RUNNEL_HA_ETL_KILLS"

// TestHAETLKill: the exactly-once ETL job (examples/etl, etl.Run, one
// process) over a SYNC_MASTER pair of `runnel broker` processes (sync
// flush), the master SIGKILLed while the job runs and restarted after a
// random outage, 5 times (RUNNEL_HA_ETL_KILLS overrides). The job reads
// its input from the slave while the master is gone; its sinks cannot
// write or commit (a slave takes no write), so it waits or fails, and is
// restarted from its checkpoint as a supervisor would; one outage lasts 8 s,
// beyond the sinks' retries, and the slave's log must not move meanwhile
// (nothing written through it). The E1 oracle
// (etl.Verify) must find the output exact, and the slave must have served
// the job's pulls. The control runs the same job with at-least-once sinks:
// the replays the kills cause (sends retried across a kill, restarts from
// the checkpoint) must show up as duplicates.
func TestHAETLKill(t *testing.T) {
	t.Parallel()
	bin := buildRunnel(t, t.TempDir())
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%v", control), func(t *testing.T) { haETLKill(t, bin, control) })
	}
}

func haETLKill(t *testing.T, bin string, control bool) {
	kills := 5
	if v := os.Getenv(envHAETLKills); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive count", envHAETLKills, v)
		}
		kills = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 24))
	tmp := t.TempDir()
	hc := startHACluster(t, bin, tmp, "sync-master")
	hc.waitInSync(t)
	c, err := client.New(client.WithNameServers(hc.ns), client.WithHeartbeatInterval(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const in, out, dlq = "ha_orders", "ha_orders_enriched", "ha_orders_dlq"
	for _, tp := range []struct {
		name string
		n    int32
	}{{in, 4}, {out, 4}, {dlq, 2}} {
		if err := c.CreateTopic(ctx, hc.master.fields["broker"], client.TopicConfig{TopicName: tp.name, ReadQueueNums: tp.n, WriteQueueNums: tp.n}); err != nil {
			t.Fatal(err)
		}
		(&brokerEnv{nsAddr: hc.ns}).waitRoute(t, tp.name, int(tp.n))
	}
	// Enough input for 3 kills or more while the job runs: the
	// at-least-once control runs several times faster (12k orders ran
	// out after 1 kill, or none, in CI runs).
	orders := 30_000
	if control {
		orders = 200_000
	}
	samples := etl.SampleOrders(orders, 300, 100, seed)
	p, err := client.NewProducer(c, "ha_etl_input")
	if err != nil {
		t.Fatal(err)
	}
	if err := etl.Produce(ctx, c, p, in, samples, nil); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()

	// The job, restarted from its checkpoint whenever it fails.
	logs := &syncbuf.Buffer{}
	var mu sync.Mutex
	var failures []string
	jobDone := make(chan error, 1)
	go func() {
		for {
			err := etl.Run(ctx, c, etl.Config{SingleProcess: true, Bounded: true, In: in, Out: out, DLQ: dlq, Group: "ha_etl",
				StateDir: filepath.Join(tmp, "job"), CheckpointInterval: 200 * time.Millisecond, AtLeastOnce: control,
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err == nil || ctx.Err() != nil {
				jobDone <- err
				return
			}
			mu.Lock()
			failures = append(failures, err.Error())
			mu.Unlock()
			pause(ctx, 200*time.Millisecond)
		}
	}()

	done := false
	killed := 0
	longOutage := ""
	for killed < kills && !done {
		select {
		case err := <-jobDone:
			if err != nil {
				t.Fatalf("job: %v\n%s", err, logs)
			}
			done = true
			continue
		case <-time.After(time.Duration(300+rng.IntN(900)) * time.Millisecond):
		}
		hc.master.kill9(t)
		killed++
		outage := time.Duration(200+rng.IntN(1300)) * time.Millisecond
		if killed == 3 && !control {
			// Longer than the sinks' send retries (10 attempts, backoff
			// to 1 s): the job waits or fails loudly, never writing
			// through the slave, whose log does not move.
			outage = 8 * time.Second
			mu.Lock()
			before := len(failures)
			mu.Unlock()
			sc := dialTB(t, hc.slave.fields["broker"])
			end := haStatus(t, sc).HAClientRuntimeInfo.MaxOffset
			pause(ctx, outage)
			if got := haStatus(t, sc).HAClientRuntimeInfo.MaxOffset; got != end {
				t.Fatalf("the slave's log moved from %d to %d with its master gone", end, got)
			}
			_ = sc.Close()
			mu.Lock()
			if len(failures) > before {
				longOutage = fmt.Sprintf("the job failed loudly in the %v outage: %s", outage, failures[before])
			} else {
				longOutage = fmt.Sprintf("the job waited through the %v outage", outage)
			}
			mu.Unlock()
		} else {
			pause(ctx, outage)
		}
		hc.master = hc.master.restart(t)
		hc.waitInSync(t)
	}
	if !done {
		select {
		case err := <-jobDone:
			if err != nil {
				t.Fatalf("job: %v\n%s", err, logs)
			}
		case <-ctx.Done():
			t.Fatalf("the job did not finish\n%s", logs)
		}
	}
	mu.Lock()
	t.Logf("%d master kills while the job ran; the job failed and was restarted %d times", killed, len(failures))
	for i, f := range failures[:min(len(failures), 5)] {
		t.Logf("failure %d: %s", i+1, f)
	}
	mu.Unlock()
	if longOutage != "" {
		t.Log(longOutage)
	}
	if killed < 3 {
		t.Fatalf("the job finished after %d kills: give it more input", killed)
	}

	// The job's source read from the slave while the master was down.
	fromSlave := pulledMessages(t, hc.slave.fields["broker"])
	t.Logf("the slave answered pulls of %d messages", fromSlave)

	// Pending half messages end by check-back: give them a moment, then
	// read everything back (runnel's client: the official one races
	// with itself under -race when shut down during a rebalance).
	time.Sleep(2 * time.Second)
	outMsgs, err1 := etl.ReadAll(ctx, c, out)
	dlqMsgs, err2 := etl.ReadAll(ctx, c, dlq)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	r := etl.Verify(samples, outMsgs, dlqMsgs)
	t.Logf("oracle: %s", r)
	if control {
		// At-least-once output carries no lineage (the oracle counts it
		// wrong whatever happens): the control is judged on the replays.
		if r.Duplicated+r.DLQDuplicated == 0 {
			t.Fatalf("control: at-least-once sinks through %d master kills left no duplicate the oracle saw (%s)", killed, r)
		}
		t.Logf("control failed the oracle as it must: %d outputs and %d dead letters duplicated", r.Duplicated, r.DLQDuplicated)
		return
	}
	if fromSlave == 0 {
		t.Error("the job never read from the slave while the master was down")
	}
	if !r.OK() {
		t.Fatalf("oracle: %s\n%s\njob log (tail):\n%s", r, strings.Join(r.Examples, "\n"), javapeer.Tail([]byte(logs.String()), 50))
	}
}

// pulledMessages returns how many messages the broker at addr returned to
// pulls today (GET_BROKER_RUNTIME_INFO's msgGetTotalTodayNow).
func pulledMessages(t *testing.T, addr string) int64 {
	t.Helper()
	c := dialTB(t, addr)
	defer c.Close()
	resp := invokeTB(t, c, protocol.NewRequest(28), "GET_BROKER_RUNTIME_INFO")
	var kv protocol.KVTable
	if err := kv.Decode(resp.Body); err != nil {
		t.Fatalf("runtime info: %v", err)
	}
	n, err := strconv.ParseInt(kv.Table["msgGetTotalTodayNow"], 10, 64)
	if err != nil {
		t.Fatalf("runtime info msgGetTotalTodayNow %q: %v", kv.Table["msgGetTotalTodayNow"], err)
	}
	return n
}
