package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// The async I/O crash test: a job enriching records through an HTTP
// service that the test runs (and that outlives the job's processes),
// killed with SIGKILL and restarted with another parallelism each time.
const (
	envAsyncChild = "RUNNEL_E2E_ASYNC_CHILD" // ordered or unordered
	envAsyncURL   = "RUNNEL_E2E_ASYNC_URL"

	asyncSplits   = 2
	asyncPerSplit = 6000
	asyncKeys     = 500
)

func init() {
	if mode := os.Getenv(envAsyncChild); mode != "" {
		os.Exit(asyncCrashChild(mode))
	}
}

// asyncService is an HTTP service on loopback: GET /?v=N answers fn(N)
// after its latency, and counts the requests per N.
type asyncService struct {
	URL     string
	fn      func(int64) int64
	latency func() time.Duration
	srv     *http.Server
	mu      sync.Mutex
	calls   map[int64]int
}

func startAsyncService(t testing.TB, fn func(int64) int64, latency func() time.Duration) *asyncService {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &asyncService{URL: "http://" + ln.Addr().String(), fn: fn, latency: latency, calls: map[int64]int{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.srv.Serve(ln) // ErrServerClosed after Close
	}()
	t.Cleanup(func() {
		_ = s.srv.Close()
		<-done
	})
	return s
}

func (s *asyncService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v, err := strconv.ParseInt(r.URL.Query().Get("v"), 10, 64)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.calls[v]++
	s.mu.Unlock()
	if d := s.latency(); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	fmt.Fprint(w, s.fn(v))
}

// counts returns the requests per N so far.
func (s *asyncService) counts() map[int64]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

// asyncClient calls an asyncService.
type asyncClient struct {
	url string
	c   *http.Client
}

func newAsyncClient(url string, conns int) *asyncClient {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute}
	return &asyncClient{url: url, c: &http.Client{Transport: tr}}
}

func (a *asyncClient) get(ctx context.Context, v int64) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/?v="+strconv.FormatInt(v, 10), nil)
	if err != nil {
		return 0, err
	}
	resp, err := a.c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("service: %s: %s", resp.Status, b)
	}
	return strconv.ParseInt(string(b), 10, 64)
}

func (a *asyncClient) close() { a.c.CloseIdleConnections() }

// asyncF is the crash test service's function.
func asyncF(v int64) int64 { return 3*v + 1 }

type enriched struct {
	ID, Val int64
}

// keySum is the per-key result of the crash job.
type keySum struct {
	Key, Sum, Count int64
}

// sumFn sums the enriched values per key.
type sumFn struct {
	sum, n *state.Value[int64]
}

func (f *sumFn) Open(ctx *pipeline.OpenContext) (err error) {
	if f.sum, err = state.NewValue(ctx.Backend(), "sum", state.Int64Codec()); err != nil {
		return err
	}
	f.n, err = state.NewValue(ctx.Backend(), "n", state.Int64Codec())
	return err
}

func (f *sumFn) ProcessElement(ctx *pipeline.KeyedContext[int64, keySum], e enriched) error {
	s, _, err := f.sum.Get()
	if err != nil {
		return err
	}
	n, _, err := f.n.Get()
	if err != nil {
		return err
	}
	s, n = s+e.Val, n+1
	if err := f.sum.Set(s); err != nil {
		return err
	}
	if err := f.n.Set(n); err != nil {
		return err
	}
	return ctx.Emit(keySum{Key: ctx.Key(), Sum: s, Count: n})
}

func (f *sumFn) OnTimer(*pipeline.KeyedContext[int64, keySum], pipeline.Timer) error { return nil }

// asyncCrashChild runs the enrichment job until it finishes (exit 0) or
// is killed: 2 splits, Rebalance to the parallelism of this run, the HTTP
// lookups (capacity 16, 5 s timeout, retries), per-key sums into the
// exactly-once KV sink.
func asyncCrashChild(mode string) int {
	dir := os.Getenv(envDir)
	par, _ := strconv.Atoi(os.Getenv(envPar))
	par = max(par, 1)
	opts := []pipeline.JobOption{
		pipeline.CheckpointDir(filepath.Join(dir, "job")),
		pipeline.CheckpointInterval(100 * time.Millisecond),
		pipeline.DefaultParallelism(par),
		pipeline.Hooks(&checkpointMarker{path: markerPath(dir)}),
	}
	if os.Getenv(envControl) != "" {
		opts = append(opts, jobFaults(failpoint.Pipeline{AsyncDropInFlight: true})...)
	}
	client := newAsyncClient(os.Getenv(envAsyncURL), 16*par)
	defer client.close()
	job := pipeline.New("crash-async", opts...)
	gen := source.NewGenerator(asyncSplits, asyncPerSplit, func(split int, seq uint64) int64 {
		if seq%3 == 2 {
			time.Sleep(time.Millisecond) // throttle: about 2-3 s per full run
		}
		return int64(split)*asyncPerSplit + int64(seq)
	})
	ids := pipeline.FromSource(job, "gen", gen)
	spread := pipeline.Map(pipeline.Rebalance(ids), "check", func(_ context.Context, v int64) (int64, error) {
		if v < 0 || v >= asyncSplits*asyncPerSplit {
			return 0, fmt.Errorf("bad id %d", v)
		}
		return v, nil
	}).WithCodec(state.Int64Codec()) // the codec of the async operator's requests in flight
	lookup := func(ctx context.Context, v int64) (enriched, error) {
		x, err := client.get(ctx, v)
		return enriched{ID: v, Val: x}, err
	}
	aopts := []pipeline.OperatorOption{pipeline.AsyncCapacity(16), pipeline.AsyncTimeout(5 * time.Second),
		pipeline.Retry(10, 10*time.Millisecond, 500*time.Millisecond)}
	var out *pipeline.Stream[enriched]
	if mode == "ordered" {
		out = pipeline.OrderedWait(spread, "enrich", lookup, aopts...)
	} else {
		out = pipeline.UnorderedWait(spread, "enrich", lookup, aopts...)
	}
	sums := pipeline.Process(pipeline.KeyBy(out, func(e enriched) int64 { return e.ID % asyncKeys }), "sum",
		func() pipeline.KeyedProcessFunc[int64, enriched, keySum] { return &sumFn{} })
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(s keySum) []byte {
		return binary.BigEndian.AppendUint64(nil, uint64(s.Key))
	}, func(dst []byte, s keySum) ([]byte, error) {
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.Sum))
		return binary.BigEndian.AppendUint64(dst, uint64(s.Count)), nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pipeline.To(sums, "kv", kv)
	if err := job.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "job:", err)
		return 1
	}
	return 0
}

// asyncExpected is the oracle: per key, the sum and count of asyncF over
// every id.
func asyncExpected() map[int64]keySum {
	want := map[int64]keySum{}
	for id := range int64(asyncSplits * asyncPerSplit) {
		k := id % asyncKeys
		w := want[k]
		want[k] = keySum{Key: k, Sum: w.Sum + asyncF(id), Count: w.Count + 1}
	}
	return want
}

// runAsyncCrash kills the child kills times, lets it finish, and returns
// the per-key sums in the KV sink and the service's request counts.
func runAsyncCrash(t *testing.T, mode string, seed uint64, kills int, control bool) (map[int64]keySum, map[int64]int) {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(seed, 7))
	var lmu sync.Mutex
	lrng := rand.New(rand.NewPCG(seed, 8))
	svc := startAsyncService(t, asyncF, func() time.Duration {
		lmu.Lock()
		defer lmu.Unlock()
		return time.Duration(2+lrng.IntN(6)) * time.Millisecond
	})
	start := func() *exec.Cmd {
		return startChildTest(t, "^$", control, envControl, envAsyncChild+"="+mode, envDir+"="+dir, envAsyncURL+"="+svc.URL,
			envPar+"="+strconv.Itoa(1+rng.IntN(3)))
	}
	killLoop(t, kills, start, func() time.Duration { return time.Duration(100+rng.IntN(500)) * time.Millisecond }, nil, markerPath(dir))
	got := map[int64]keySum{}
	for ks, vs := range readKV(t, filepath.Join(dir, "kv")) {
		k, v := []byte(ks), []byte(vs)
		if len(k) != 8 || len(v) != 16 {
			t.Fatalf("KV entry %x=%x", k, v)
		}
		key := int64(binary.BigEndian.Uint64(k))
		got[key] = keySum{Key: key, Sum: int64(binary.BigEndian.Uint64(v)), Count: int64(binary.BigEndian.Uint64(v[8:]))}
	}
	return got, svc.counts()
}

func asyncKills() int {
	if testing.Short() {
		return 3
	}
	return 5
}

// TestE2EAsyncCrashExactlyOnce: with SIGKILLs at random points (half of
// them after a completed checkpoint) and the parallelism changed at every
// restart, every record's lookup result is counted exactly once, in both
// result modes; the service saw every record, some more than once (the
// requests in flight at the restored checkpoint, and those after it).
func TestE2EAsyncCrashExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	for _, mode := range []string{"ordered", "unordered"} {
		t.Run(mode, func(t *testing.T) {
			got, calls := runAsyncCrash(t, mode, seed, asyncKills(), false)
			if n, ex := diffMaps(got, asyncExpected(), func(v keySum) string { return fmt.Sprintf("%+v", v) }); n != 0 {
				t.Fatalf("seed %d: %d keys differ after crashes (%s)", seed, n, ex)
			}
			total, repeated := 0, 0
			for id := range int64(asyncSplits * asyncPerSplit) {
				c := calls[id]
				if c == 0 {
					t.Fatalf("seed %d: record %d never requested, yet counted", seed, id)
				}
				total += c
				if c > 1 {
					repeated++
				}
			}
			if repeated == 0 {
				t.Fatalf("seed %d: no request was repeated after %d kills: the kills proved nothing", seed, asyncKills())
			}
			t.Logf("%d requests for %d records (%d records requested more than once)", total, asyncSplits*asyncPerSplit, repeated)
		})
	}
}

// TestE2EAsyncCrashControl proves the check above can fail: an operator
// that leaves its requests in flight out of its checkpoints loses their
// records on a restore.
func TestE2EAsyncCrashControl(t *testing.T) {
	requireFailpoints(t)
	seed := testSeed(t)
	got, _ := runAsyncCrash(t, "unordered", seed, asyncKills(), true)
	n, ex := diffMaps(got, asyncExpected(), func(v keySum) string { return fmt.Sprintf("%+v", v) })
	if n == 0 {
		t.Fatalf("seed %d: the faulty job passed the exactly-once check: the check cannot fail", seed)
	}
	t.Logf("control run failed the check as it must: %d keys differ (%s)", n, ex)
}
