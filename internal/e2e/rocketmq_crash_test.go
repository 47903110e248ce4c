package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The RocketMQ crash test re-executes this test binary, running only
// TestRocketMQCrashChild, as the job process; these variables carry its
// setup.
const (
	envMQChild   = "RUNNEL_E2E_MQ_CHILD"
	envMQNamesrv = "RUNNEL_E2E_MQ_NAMESRV"
	envMQDir     = "RUNNEL_E2E_MQ_DIR"
	envMQControl = "RUNNEL_E2E_MQ_CONTROL"
	envMQPar     = "RUNNEL_E2E_MQ_PARALLELISM"

	mqCrashTopic  = "crash_input"
	mqCrashQueues = 4
	mqCrashPer    = 25_000 // 100k records
)

// mqEnv is an embedded name server and broker in this (the parent) process,
// with a client.
type mqEnv struct {
	ns *namesrv.Server
	b  *broker.Broker
	c  *client.Client
}

func startMQ(tb testing.TB) *mqEnv {
	tb.Helper()
	cl := testutil.RunCluster(tb)
	c, err := newMQClient(cl.NameServer)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return &mqEnv{ns: cl.Embedded.Namesrv(), b: cl.Broker, c: c}
}

func newMQClient(addr string) (*client.Client, error) {
	return client.New(client.WithNameServers(addr), client.WithClientIP(netip.MustParseAddr("127.0.0.1")))
}

// createTopic creates topic with n queues and waits for its route.
func (e *mqEnv) createTopic(tb testing.TB, topic string, n int) []protocol.MessageQueue {
	tb.Helper()
	return testutil.CreateTopic(tb, e.c, e.b.Addr(), topic, n)
}

// preload stores per records in each queue of qs, record seq of queue q
// having body body(q, seq), in batches, and returns the time it took.
func (e *mqEnv) preload(tb testing.TB, qs []protocol.MessageQueue, per int, body func(q int, seq uint64) []byte) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p, err := client.NewProducer(e.c, "e2e_preload")
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	const batch = 256
	msgs := make([]*client.Message, 0, batch)
	for qi := range qs {
		q := qs[qi]
		for seq := 0; seq < per; {
			msgs = msgs[:0]
			for ; seq < per && len(msgs) < batch; seq++ {
				msgs = append(msgs, &client.Message{Topic: q.Topic, Body: body(qi, uint64(seq)), Queue: &q})
			}
			if _, err := p.Send(ctx, msgs...); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return time.Since(start)
}

// TestRocketMQCrashChild is the job process of the RocketMQ crash tests
// (it does nothing unless started by them): a keyed count of the
// preloaded topic, read with source/rocketmq bounded at the offsets the
// topic had when the job first opened its queues, into a KV sink, with
// checkpoints every 100 ms. It throttles itself so that kills land mid-run.
func TestRocketMQCrashChild(t *testing.T) {
	if os.Getenv(envMQChild) == "" {
		t.Skip("only run as the child of the RocketMQ crash tests")
	}
	dir := os.Getenv(envMQDir)
	par, _ := strconv.Atoi(os.Getenv(envMQPar))
	c, err := newMQClient(os.Getenv(envMQNamesrv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := []pipeline.JobOption{
		pipeline.CheckpointDir(filepath.Join(dir, "job")),
		pipeline.CheckpointInterval(100 * time.Millisecond),
		pipeline.DefaultParallelism(max(par, 1)),
		pipeline.Hooks(&checkpointMarker{path: markerPath(dir)}),
	}
	if os.Getenv(envMQControl) != "" {
		opts = append(opts, jobFaults(failpoint.Pipeline{OffsetsBeforeState: true})...)
	}
	src, err := srcmq.New(c, mqCrashTopic, srcmq.WithStop(srcmq.StopAtLatest()), srcmq.WithGroup("e2e_crash"))
	if err != nil {
		t.Fatal(err)
	}
	job := pipeline.New("mq-crash-count", opts...)
	keys := pipeline.FromSourceDecoded(job, "input", src, func(m srcmq.Message) (uint64, error) {
		if m.QueueOffset%6 == 5 {
			time.Sleep(time.Millisecond) // throttle: a few seconds per full run
		}
		return strconv.ParseUint(string(m.Body), 10, 64)
	})
	counts := pipeline.Process(pipeline.KeyBy(keys, func(k uint64) uint64 { return k }), "count",
		func() pipeline.KeyedProcessFunc[uint64, uint64, counted] { return &countFn{} })
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(c counted) []byte {
		return binary.BigEndian.AppendUint64(nil, c.Key)
	}, func(dst []byte, c counted) ([]byte, error) {
		return binary.BigEndian.AppendUint64(dst, uint64(c.Count)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pipeline.To(counts, "kv", kv)
	if err := job.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// runMQCrashSchedule runs the child job against the parent's broker, kills
// it kills times at random points, lets it finish, and returns the per-key
// counts in the KV sink.
func runMQCrashSchedule(t *testing.T, e *mqEnv, seed uint64, kills int, control bool) map[uint64]int64 {
	t.Helper()
	if control {
		requireFailpoints(t)
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(seed, 2))
	var out bytes.Buffer // the current child's output, shown when it fails
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRocketMQCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), envMQChild+"=1", envMQDir+"="+dir, envMQNamesrv+"="+e.ns.Addr(),
			envMQPar+"="+strconv.Itoa(1+rng.IntN(3)))
		if control {
			cmd.Env = append(cmd.Env, envMQControl+"=1")
		}
		out.Reset()
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	killLoop(t, kills, start, func() time.Duration { return time.Duration(150+rng.IntN(500)) * time.Millisecond }, out.String, markerPath(dir))
	return readCounts(t, filepath.Join(dir, "kv"))
}

// mqCrashInput starts the broker and preloads 100k keyed records (key
// crashKey(queue, seq), as decimal text) into a 4-queue topic; it returns
// the expected per-key counts.
func mqCrashInput(t *testing.T) (*mqEnv, map[uint64]int64) {
	e := startMQ(t)
	qs := e.createTopic(t, mqCrashTopic, mqCrashQueues)
	want := make(map[uint64]int64)
	took := e.preload(t, qs, mqCrashPer, func(q int, seq uint64) []byte {
		k := crashKey(q, seq)
		want[k]++
		return strconv.AppendUint(nil, k, 10)
	})
	t.Logf("preloaded %d records in %v", mqCrashQueues*mqCrashPer, took.Round(time.Millisecond))
	return e, want
}

func mqCrashKills() int {
	if testing.Short() {
		return 3
	}
	return 10
}

// TestE2ERocketMQCrashExactlyOnce: the keyed count of a preloaded topic,
// SIGKILLed at random points and restarted each time, ends with exactly the
// input's per-key counts.
func TestE2ERocketMQCrashExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	e, want := mqCrashInput(t)
	got := runMQCrashSchedule(t, e, seed, mqCrashKills(), false)
	if n, ex := diffCounts(got, want); n != 0 {
		t.Fatalf("seed %d: %d keys differ after crashes (%s)", seed, n, ex)
	}
}

// TestE2ERocketMQCrashControl proves the check above can fail: with source
// offsets checkpointed behind the state (failpoint.Pipeline), restores
// count records twice.
func TestE2ERocketMQCrashControl(t *testing.T) {
	seed := testSeed(t)
	e, want := mqCrashInput(t)
	got := runMQCrashSchedule(t, e, seed, mqCrashKills(), true)
	n, ex := diffCounts(got, want)
	if n == 0 {
		t.Fatalf("seed %d: the faulty job passed the exactly-once check: the check cannot fail", seed)
	}
	t.Logf("control run failed the check as it must: %d keys differ (%s)", n, ex)
}
