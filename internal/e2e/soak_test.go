package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/etl/etl"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// The soak (`make soak`; skipped unless RUNNEL_SOAK is set): examples/etl's
// job exactly-once and a windowed job (per-user counts in 1 s tumbling
// event-time windows) run together on the embedded broker, in this
// process, each fed at a steady rate, for RUNNEL_SOAK (a duration, e.g.
// 30m; "1" means 30m). RUNNEL_SOAK_RATE sets each input's rate (records/s,
// default 2000). Every 10 s it samples the throughput of both jobs (output
// records in the interval), their p99 latency over it (ETL: from the order's
// production to its exactly-once output being readable; windows: from the
// window's end to its result reaching the sink), the process's Go heap
// (live after a GC) and its open files, and prints them as a table at the
// end. Both jobs' state read caches are 4 MiB per subtask (soakReadCache).
// It fails on any job error, when the ETL output is not exactly the
// valid input (no loss, no duplicate), when either job's throughput over
// the second half falls below 90 % of the input's, when the ETL output lags
// more than 10 s of input at the end, and when the heap or
// the open files grew: the mean of the last third of the samples above
// 1.5 × that of the first third (after the first minute) plus 16 MiB, or
// more than 16 files above the first third's maximum.
const (
	envSoak     = "RUNNEL_SOAK"
	envSoakRate = "RUNNEL_SOAK_RATE"
	// envSoakProfiles names a directory: the soak writes a heap profile
	// there with every sample (heap-<n>.pprof), to find what grows.
	envSoakProfiles = "RUNNEL_SOAK_PROFILES"
	soakSample      = 10 * time.Second
	soakIn          = "soak_orders"
	soakOut         = "soak_out"
	soakDLQ         = "soak_dlq"
	soakClicks      = "soak_clicks"
	// soakReadCache is both jobs' state read cache per subtask: a windowed
	// job's keys churn (every window's state is new keys), so the default
	// 32 MiB would fill for tens of minutes at the soak's rate and look
	// like growth; at 4 MiB the caches are full within the first minutes
	// and the growth check sees what is left.
	soakReadCache = 4 << 20
)

type soakSampleRow struct {
	at             time.Duration
	in             int64   // orders produced in the interval
	lag            int64   // orders produced and not yet read from the ETL output
	etlN           int64   // ETL outputs read in the interval
	winN           int64   // clicks counted by the window results of the interval
	etlP99, winP99 float64 // ms
	heap           int64
	files          int
}

// latencies collects latencies (ms) of one interval.
type latencies struct {
	mu sync.Mutex
	v  []float64
}

func (l *latencies) add(ms float64) {
	l.mu.Lock()
	l.v = append(l.v, ms)
	l.mu.Unlock()
}

// take returns the interval's count and p99 and starts the next one.
func (l *latencies) take() (int64, float64) {
	l.mu.Lock()
	v := l.v
	l.v = nil
	l.mu.Unlock()
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	return int64(len(v)), v[len(v)*99/100]
}

func soakDuration(t *testing.T) time.Duration {
	raw := os.Getenv(envSoak)
	if raw == "" {
		t.Skip("the soak runs for minutes: `make soak` (or " + envSoak + "=30m) runs it")
	}
	if raw == "1" {
		return 30 * time.Minute
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < soakSample {
		t.Fatalf("%s=%q: want a duration of at least %v", envSoak, raw, soakSample)
	}
	return d
}

func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	rate := 2000
	if v, err := strconv.Atoi(os.Getenv(envSoakRate)); err == nil && v > 0 {
		rate = v
	}
	mq := startMQ(t)
	mq.createTopic(t, soakIn, 4)
	mq.createTopic(t, soakOut, 4)
	mq.createTopic(t, soakDLQ, 2)
	mq.createTopic(t, soakClicks, 4)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	fail := func(what string, err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			errs <- fmt.Errorf("%s: %w", what, err)
			cancel()
		}
	}

	// The jobs.
	jobCtx, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	wg.Go(func() {
		fail("etl job", etl.Run(jobCtx, mq.c, etl.Config{SingleProcess: true, In: soakIn, Out: soakOut, DLQ: soakDLQ,
			Group: "soak_etl", StateDir: t.TempDir(), CheckpointInterval: time.Second,
			JobOptions: []pipeline.JobOption{pipeline.StateReadCache(soakReadCache)}}))
	})
	var winLat latencies
	var winRecs atomic.Int64
	wg.Go(func() { fail("window job", runSoakWindows(jobCtx, t, mq.c, &winLat, &winRecs)) })

	// The producers: every 10 ms, orders and as many clicks up to the rate,
	// each stamped with its production time.
	prod, err := client.NewProducer(mq.c, "soak_producer", client.WithSelector(client.HashBySharding()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var produced, produceFailed, clickFailed atomic.Int64
	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	var sendErr atomic.Pointer[error]
	var sending sync.WaitGroup
	onSent := func(_ client.SendResult, err error) {
		defer sending.Done()
		if err != nil {
			produceFailed.Add(1)
			sendErr.CompareAndSwap(nil, &err)
		}
	}
	onClickSent := func(_ client.SendResult, err error) {
		defer sending.Done()
		if err != nil {
			clickFailed.Add(1)
			sendErr.CompareAndSwap(nil, &err)
		}
	}
	var prodDone sync.WaitGroup
	prodDone.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		seq := 0
		begin := time.Now()
		for {
			select {
			case <-prodCtx.Done():
				return
			case <-tick.C:
			}
			// Paced by the clock, not by the ticks (a loaded machine
			// drops ticks): as many as the rate asks for by now.
			now := time.Now()
			for range int(now.Sub(begin).Seconds()*float64(rate)) - seq {
				id := "o" + strconv.Itoa(seq)
				cust := "c" + strconv.Itoa(seq%1000)
				body := fmt.Appendf(nil, `{"id":%q,"customer":%q,"amount":%d.5,"currency":"EUR","ts":%q}`,
					id, cust, 1+seq%500, now.Format(time.RFC3339Nano))
				click := fmt.Appendf(nil, "u%d,%d", seq%500, now.UnixMilli())
				seq++
				produced.Add(1)
				// Not cancelled when producing stops: every send gets its
				// answer (sending waits below).
				sending.Add(2)
				prod.SendAsync(context.Background(), onSent, &client.Message{Topic: soakIn, Body: body, Keys: []string{id}, ShardingKey: cust})
				prod.SendAsync(context.Background(), onClickSent, &client.Message{Topic: soakClicks, Body: click})
			}
		}
	})

	// The reader of the ETL output: latency from production, and every
	// order id seen once.
	var etlLat latencies
	var seen soakSeen
	wg.Go(func() { fail("output reader", readSoakOutput(ctx, mq.c, &etlLat, &seen)) })

	// Sampling.
	var rows []soakSampleRow
	var lastWin, lastIn int64
	start := time.Now()
	tick := time.NewTicker(soakSample)
	defer tick.Stop()
	t.Logf("soak: %v at %d orders/s and %d clicks/s", dur, rate, rate)
loop:
	for time.Since(start) < dur {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
		r := soakSampleRow{at: time.Since(start).Round(time.Second)}
		r.etlN, r.etlP99 = etlLat.take()
		p := produced.Load()
		r.in, lastIn = p-lastIn, p
		r.lag = p - seen.count()
		_, r.winP99 = winLat.take()
		n := winRecs.Load()
		r.winN, lastWin = n-lastWin, n
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		r.heap = int64(ms.HeapAlloc)
		if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
			r.files = len(ents)
		}
		rows = append(rows, r)
		writeSoakHeapProfile(t, len(rows))
	}
	stopProducing()
	prodDone.Wait()
	sending.Wait()
	// Let the jobs drain what was produced, then stop them.
	drainUntil := time.Now().Add(60 * time.Second)
	for ctx.Err() == nil && seen.count() < produced.Load()-produceFailed.Load() && time.Now().Before(drainUntil) {
		time.Sleep(100 * time.Millisecond)
	}
	stopJobs()
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	printSoakTable(t, rows, rate)
	if n, m := produceFailed.Load(), clickFailed.Load(); n+m > 0 {
		t.Errorf("%d order and %d click sends failed, the first: %v", n, m, *sendErr.Load())
	}
	if got, want := seen.count(), produced.Load()-produceFailed.Load(); got != want || seen.dups.Load() > 0 {
		t.Errorf("ETL output: %d distinct orders of %d produced, %d duplicates", got, want, seen.dups.Load())
	}
	checkSoakGrowth(t, rows, rate)
}

// soakSeen records the order ids ("o<seq>") of the ETL output.
type soakSeen struct {
	mu   sync.Mutex
	bits []uint64
	n    int64
	dups atomic.Int64
}

func (s *soakSeen) add(seq int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.bits) <= seq/64 {
		s.bits = append(s.bits, 0)
	}
	w, b := &s.bits[seq/64], uint64(1)<<(seq%64)
	if *w&b != 0 {
		s.dups.Add(1)
		return
	}
	*w |= b
	s.n++
}

func (s *soakSeen) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// readSoakOutput long-polls every queue of the ETL output until ctx ends.
func readSoakOutput(ctx context.Context, c *client.Client, lat *latencies, seen *soakSeen) error {
	r, err := c.Route(ctx, soakOut)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(r.SubscribeQueues()))
	for _, q := range r.SubscribeQueues() {
		wg.Go(func() {
			var off int64
			for ctx.Err() == nil {
				res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: off, MaxMsgs: 256, Suspend: 5 * time.Second, Group: "soak_reader"})
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				now := time.Now()
				for i := range res.Messages {
					var o struct {
						ID string `json:"id"`
						TS string `json:"ts"`
					}
					if err := json.Unmarshal(res.Messages[i].Body, &o); err != nil {
						errc <- fmt.Errorf("output %s: %w", res.Messages[i].Body, err)
						return
					}
					ts, err := time.Parse(time.RFC3339Nano, o.TS)
					seq, err2 := strconv.Atoi(strings.TrimPrefix(o.ID, "o"))
					if err != nil || err2 != nil {
						errc <- fmt.Errorf("output %s: bad id or ts", res.Messages[i].Body)
						return
					}
					lat.add(float64(now.Sub(ts).Microseconds()) / 1000)
					seen.add(seq)
				}
				off = res.NextBeginOffset
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// runSoakWindows runs the windowed job: clicks "user,unixMillis" → per-user
// counts in 1 s tumbling event-time windows (watermarks 200 ms behind);
// the latency of a result is the time from its window's end to the sink.
func runSoakWindows(ctx context.Context, t *testing.T, c *client.Client, lat *latencies, recs *atomic.Int64) error {
	src, err := srcmq.New(c, soakClicks, srcmq.WithOffsetReporting(false))
	if err != nil {
		return err
	}
	type click struct {
		User string
		TS   int64
	}
	decode := func(m srcmq.Message) (click, error) {
		user, ms, ok := strings.Cut(string(m.Body), ",")
		v, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil {
			return click{}, fmt.Errorf("bad click %q", m.Body)
		}
		return click{User: user, TS: v}, nil
	}
	job := pipeline.New("soak-windows", pipeline.CheckpointDir(t.TempDir()), pipeline.CheckpointInterval(time.Second),
		pipeline.StateReadCache(soakReadCache))
	clicks := pipeline.FromSourceDecoded(job, "clicks", src, decode,
		pipeline.BoundedOutOfOrderness(200*time.Millisecond)).
		WithTimestamps(func(c click) time.Time { return time.UnixMilli(c.TS) })
	counts := window.Apply(pipeline.KeyBy(clicks, func(c click) string { return c.User }), "count",
		window.Tumbling(time.Second), window.Count[click]())
	pipeline.To(counts, "sink", sink.NewFunc(func(_ context.Context, r window.Result[string, int64]) error {
		lat.add(float64(time.Since(r.End).Microseconds()) / 1000)
		recs.Add(r.Value)
		return nil
	}, nil))
	return job.Run(ctx)
}

func printSoakTable(t *testing.T, rows []soakSampleRow, rate int) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%8s %10s %10s %8s %11s %10s %11s %9s %6s\n", "time", "in rec/s", "etl rec/s", "etl lag", "etl p99 ms",
		"win rec/s", "win p99 ms", "heap MiB", "files")
	for _, r := range rows {
		sec := soakSample.Seconds()
		fmt.Fprintf(&b, "%8v %10.0f %10.0f %8d %11.1f %10.0f %11.1f %9.1f %6d\n", r.at, float64(r.in)/sec, float64(r.etlN)/sec,
			r.lag, r.etlP99, float64(r.winN)/sec, r.winP99, float64(r.heap)/mib, r.files)
	}
	fmt.Fprintf(&b, "input: %d orders/s and %d clicks/s (500 users: 500 window results a second)\n", rate, rate)
	t.Log(b.String())
}

// checkSoakGrowth fails t when the heap or the open files grew, or the ETL
// throughput dropped, over the run (see the comment at the top).
func checkSoakGrowth(t *testing.T, rows []soakSampleRow, rate int) {
	warm := 0
	for warm < len(rows) && rows[warm].at < time.Minute {
		warm++
	}
	rest := rows[warm:]
	if len(rest) < 3 {
		t.Logf("too few samples after the first minute (%d) for a growth check", len(rest))
		return
	}
	third := len(rest) / 3
	first, last := rest[:third], rest[len(rest)-third:]
	mean := func(rs []soakSampleRow) float64 {
		s := 0.0
		for _, r := range rs {
			s += float64(r.heap)
		}
		return s / float64(len(rs))
	}
	if f, l := mean(first), mean(last); l > 1.5*f+16*mib {
		t.Errorf("heap grew: %.1f MiB in the first third, %.1f MiB in the last", f/mib, l/mib)
	}
	maxFiles := 0
	for _, r := range first {
		maxFiles = max(maxFiles, r.files)
	}
	for _, r := range last {
		if r.files > maxFiles+16 {
			t.Errorf("open files grew: at most %d in the first third, %d at %v", maxFiles, r.files, r.at)
			break
		}
	}
	half := rest[len(rest)/2:]
	var in, etlN, winN int64
	for _, r := range half {
		in, etlN, winN = in+r.in, etlN+r.etlN, winN+r.winN
	}
	secs := float64(len(half)) * soakSample.Seconds()
	if got, want := float64(etlN)/secs, 0.9*float64(in)/secs; got < want {
		t.Errorf("ETL throughput over the second half: %.0f records/s, input %.0f/s", got, float64(in)/secs)
	}
	if got, want := float64(winN)/secs, 0.9*float64(in)/secs; got < want {
		t.Errorf("window job throughput over the second half: %.0f records/s, input %.0f/s", got, float64(in)/secs)
	}
	if l := rows[len(rows)-1].lag; l > int64(10*rate) {
		t.Errorf("the ETL output lags %d orders (more than 10 s of input) at the end", l)
	}
}

// writeSoakHeapProfile writes the n-th sample's heap profile into the
// directory envSoakProfiles names (nothing when it is unset).
func writeSoakHeapProfile(t *testing.T, n int) {
	dir := os.Getenv(envSoakProfiles)
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%03d.pprof", n)))
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Error(err)
	}
}
