package otel_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testutil"
	rotel "github.com/runnel-dev/runnel/otel"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// scrape reads http://addr/metrics and returns the samples: the series
// (name{labels} as printed) and value.
func scrape(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("scrape: %s: %s", resp.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("bad sample line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("bad sample line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// sample returns the value of the one series whose text starts with name
// and contains every label (k="v").
func sample(s map[string]float64, name string, labels ...string) (float64, bool) {
	var (
		v     float64
		found bool
	)
next:
	for k, x := range s {
		if !strings.HasPrefix(k, name+"{") && k != name {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(k, l) {
				continue next
			}
		}
		if found {
			return 0, false // ambiguous
		}
		v, found = x, true
	}
	return v, found
}

// TestMetricsPrometheus runs an unbounded job reading a preloaded topic,
// with metrics served on the job's metrics address, and scrapes them while
// it runs: throughput per operator, per-queue lag, checkpoints, pull
// latency and the broker's counters must be there with plausible values.
func TestMetricsPrometheus(t *testing.T) {
	const n = 500
	tel, err := rotel.New(rotel.WithPrometheus())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	cl := newCluster(t)
	unobserve, err := tel.ObserveBroker(cl.b, "broker-a")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unobserve() }()
	admin := cl.client()
	cl.createTopic(admin, "metrics_in", 2)
	p := cl.producer(admin, "metrics_producer")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for qid := range 2 {
		q := queue("metrics_in", qid)
		for i := 0; i < n/2; i += 50 {
			batch := make([]*client.Message, 50)
			for j := range batch {
				batch[j] = &client.Message{Topic: "metrics_in", Queue: &q, Body: []byte(strconv.Itoa(i + j))}
			}
			if _, err := p.Send(ctx, batch...); err != nil {
				t.Fatal(err)
			}
		}
	}

	src, err := srcmq.New(cl.client(tel), "metrics_in", srcmq.WithGroup("metrics_job"), srcmq.WithPollTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	job := pipeline.New("metrics-job", pipeline.Hooks(tel), pipeline.CheckpointDir(t.TempDir()),
		pipeline.CheckpointInterval(50*time.Millisecond),
		pipeline.MetricsAddress("127.0.0.1:0", func(a string) { addrc <- a }))
	nums := pipeline.Map(pipeline.FromSource(job, "in", src), "parse", func(_ context.Context, m srcmq.Message) (int, error) {
		return strconv.Atoi(string(m.Body))
	})
	pipeline.To(nums, "discard", sink.NewFunc(func(context.Context, int) error { return nil }, nil))
	jobCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- job.Run(jobCtx) }()

	var metricsAddr string
	select {
	case metricsAddr = <-addrc:
	case err := <-done:
		t.Fatalf("job ended before listening: %v", err)
	}
	var s map[string]float64
	testutil.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		select {
		case err := <-done:
			return fmt.Errorf("job ended early: %v", err)
		default:
		}
		var err error
		if s, err = scrape(ctx, metricsAddr); err != nil {
			return err
		}
		in, ok := sample(s, "runnel_operator_records_in_total", `runnel_operator_uid="parse"`)
		if !ok || in < n {
			return fmt.Errorf("parse records in = %v (%v), want %d", in, ok, n)
		}
		for qid := range 2 {
			lag, ok := sample(s, "runnel_source_lag", fmt.Sprintf(`runnel_split="broker-a/%d"`, qid))
			if !ok || lag != 0 {
				return fmt.Errorf("lag of queue %d = %v (%v), want 0 once checkpointed", qid, lag, ok)
			}
		}
		if c, ok := sample(s, "runnel_checkpoints_total", `runnel_checkpoint_result="completed"`); !ok || c < 2 {
			return fmt.Errorf("completed checkpoints = %v (%v)", c, ok)
		}
		// The counter and the duration histogram are recorded one after
		// the other: a scrape may fall between them.
		if c, ok := sample(s, "runnel_checkpoint_duration_seconds_count", `runnel_job="metrics-job"`, `completed`); !ok || c < 2 {
			return fmt.Errorf("checkpoint durations recorded = %v (%v)", c, ok)
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	check := func(name string, ok bool, v float64, lo, hi float64) {
		t.Helper()
		if !ok || v < lo || v > hi {
			t.Errorf("%s = %v (present %v), want in [%v, %v]", name, v, ok, lo, hi)
		}
	}
	v, ok := sample(s, "runnel_operator_records_out_total", `runnel_operator_uid="parse"`)
	check("parse records out", ok, v, n, n)
	v, ok = sample(s, "runnel_operator_records_in_total", `runnel_operator_uid="discard"`)
	check("sink records in", ok, v, 0, n) // the sink counts per batch
	v, ok = sample(s, "runnel_checkpoint_duration_seconds_count", `runnel_job="metrics-job"`, `completed`)
	check("checkpoint duration count", ok, v, 2, 1e6)
	v, ok = sample(s, "runnel_checkpoint_duration_seconds_sum", `runnel_job="metrics-job"`, `completed`)
	check("checkpoint duration sum", ok, v, 1e-6, 60)
	v, ok = sample(s, "runnel_checkpoint_size_bytes_sum", `runnel_job="metrics-job"`)
	check("checkpoint bytes sum", ok, v, 1, 1e9)
	v, ok = sample(s, "messaging_client_operation_duration_seconds_count", `messaging_operation_name="pull"`, `messaging_destination_partition_id="0"`)
	check("pull count (queue 0)", ok, v, 1, 1e9)
	v, ok = sample(s, "messaging_client_consumed_messages_total", `messaging_destination_partition_id="1"`)
	check("consumed (queue 1)", ok, v, n/2, n/2)
	v, ok = sample(s, "runnel_source_checkpoint_notifications_total", `runnel_operator_uid="in"`, `runnel_result="ok"`)
	check("source checkpoint notifications (ok)", ok, v, 2, 1e6) // every split, every completed checkpoint
	if v, ok := sample(s, "runnel_source_checkpoint_notifications_total", `runnel_result="failed"`); ok && v != 0 {
		t.Errorf("%v failed source checkpoint notifications", v)
	}
	v, ok = sample(s, "runnel_broker_send_requests_total")
	check("broker send requests", ok, v, n/50, 1e9)
	v, ok = sample(s, "runnel_broker_pulled_messages_total")
	check("broker pulled messages", ok, v, n, 1e9)
	v, ok = sample(s, "runnel_broker_consumer_groups")
	check("broker consumer groups", ok, v, 1, 1e4)
	if _, ok := sample(s, "runnel_broker_longpoll_waiters"); !ok {
		t.Errorf("no long-poll waiters gauge")
	}
	if t.Failed() {
		for k, v := range s {
			if strings.HasPrefix(k, "runnel") || strings.HasPrefix(k, "messaging") {
				t.Logf("%s %v", k, v)
			}
		}
	}
}
