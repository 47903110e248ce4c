package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/state"
)

// Two-input jobs (issue 26) under crashes and metamorphic configurations:
// an interval join and a tumbling window join of two generated sources,
// and a keyed operator with broadcast rules. Every join result (and every
// event with its rule) is folded into a per-key tally — the number of
// results and the sum of their hashes — which a KV sink keeps; the tallies
// must equal an oracle computed directly from the generated input. Event
// times increase within every split, so no record is ever late, whatever
// the splits' interleaving: the results do not depend on it.

const (
	envTwoChild   = "RUNNEL_E2E_TWOINPUT_CHILD" // the job: interval, window or broadcast
	envTwoControl = "RUNNEL_E2E_TWOINPUT_CONTROL"

	twoKeys      = 50
	twoSplitsA   = 2
	twoPerSplitA = 3000
	twoPerSplitB = 4000
	twoEvents    = 8000 // the broadcast job's records
)

var twoOrigin = time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// sideRec is a record of a join input.
type sideRec struct {
	ID  uint64
	Key int64
	TS  int64
}

func genA(split int, seq uint64) sideRec {
	return sideRec{ID: uint64(split)<<32 | seq, Key: int64((seq*7 + uint64(split)) % twoKeys),
		TS: twoOrigin + int64(seq)*int64(10*time.Millisecond) + int64(split)*int64(3*time.Millisecond)}
}

func genB(_ int, seq uint64) sideRec {
	return sideRec{ID: 1<<62 | seq, Key: int64((seq * 11) % twoKeys), TS: twoOrigin + int64(seq)*int64(8*time.Millisecond)}
}

func mix(a, b uint64) uint64 {
	x := a*0x9e3779b97f4a7c15 ^ (b + 0x632be59bd9b4e5b)
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>29
}

// pairOut is a result to tally: its key and hash.
type pairOut struct {
	Key  int64
	Hash uint64
}

type tally struct {
	Key   int64
	Count int64
	Sum   uint64
}

// tallyFn folds a key's results into its tally and emits it.
type tallyFn struct{ t *state.Value[tally] }

func (f *tallyFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.t, err = state.NewValue(ctx.Backend(), "tally", pipeline.JSON[tally]())
	return err
}

func (f *tallyFn) ProcessElement(ctx *pipeline.KeyedContext[int64, tally], p pairOut) error {
	t, _, err := f.t.Get()
	if err != nil {
		return err
	}
	t = tally{Key: p.Key, Count: t.Count + 1, Sum: t.Sum + p.Hash}
	if err := f.t.Set(t); err != nil {
		return err
	}
	return ctx.Emit(t)
}

func (f *tallyFn) OnTimer(*pipeline.KeyedContext[int64, tally], pipeline.Timer) error { return nil }

const (
	ijLower = -100 * time.Millisecond
	ijUpper = 150 * time.Millisecond
	wjSize  = 500 * time.Millisecond
)

// twoInputJob builds job kind's graph up to its tallies. throttle slows
// the sources down so that kills land mid-run.
func twoInputJob(job *pipeline.Job, kind string, throttle bool) *pipeline.Stream[tally] {
	slow := func(gen func(int, uint64) sideRec) func(int, uint64) sideRec {
		if !throttle {
			return gen
		}
		return func(split int, seq uint64) sideRec {
			if seq%2 == 1 {
				time.Sleep(time.Millisecond) // about 2 s per full run
			}
			return gen(split, seq)
		}
	}
	ts := func(r sideRec) time.Time { return time.Unix(0, r.TS) }
	var pairs *pipeline.Stream[pairOut]
	switch kind {
	case "broadcast":
		return broadcastJob(job, throttle)
	case "interval", "window":
		a := pipeline.FromSource(job, "a", source.NewGenerator(twoSplitsA, twoPerSplitA, slow(genA))).WithTimestamps(ts)
		b := pipeline.FromSource(job, "b", source.NewGenerator(1, twoPerSplitB, slow(genB))).WithTimestamps(ts)
		keyOf := func(r sideRec) int64 { return r.Key }
		c := pipeline.ConnectKeyed(pipeline.KeyBy(a, keyOf), pipeline.KeyBy(b, keyOf))
		if kind == "interval" {
			pairs = pipeline.IntervalJoin(c, "join", ijLower, ijUpper, func(_ context.Context, x, y sideRec) (pairOut, error) {
				return pairOut{Key: x.Key, Hash: mix(x.ID, y.ID)}, nil
			})
		} else {
			res := window.Join(c, "join", window.Tumbling(wjSize), func(x, y sideRec) (pairOut, error) {
				return pairOut{Key: x.Key, Hash: mix(x.ID, y.ID)}, nil
			})
			pairs = pipeline.Map(res, "value", func(_ context.Context, r window.Result[int64, pairOut]) (pairOut, error) {
				return r.Value, nil
			})
		}
	default:
		panic("unknown two-input job " + kind)
	}
	return pipeline.Process(pipeline.KeyBy(pairs, func(p pairOut) int64 { return p.Key }), "tally",
		func() pipeline.KeyedProcessFunc[int64, pairOut, tally] { return &tallyFn{} })
}

// bcRec is a record of the broadcast job: a rule (Rule set: rule Key gets
// value Val) or an event of key Key that applies rule Val%5.
type bcRec struct {
	Rule bool
	Key  int64
	Val  uint64
}

func genBroadcast(_ int, seq uint64) bcRec {
	if seq%100 == 0 {
		return bcRec{Rule: true, Key: int64(seq/100) % 5, Val: seq}
	}
	return bcRec{Key: int64(seq % 40), Val: seq}
}

type bcFn struct {
	rules *pipeline.BroadcastMap[int64, uint64]
}

func (f *bcFn) Open(ctx *pipeline.OpenContext) (err error) {
	f.rules, err = pipeline.NewBroadcastMap(ctx, "rules", state.Int64Codec(), state.Uint64Codec())
	return err
}

func (f *bcFn) ProcessElement(ctx *pipeline.KeyedContext[int64, pairOut], e bcRec) error {
	v, _, err := f.rules.Get(int64(e.Val % 5))
	if err != nil {
		return err
	}
	return ctx.Emit(pairOut{Key: e.Key, Hash: mix(e.Val, v)})
}

func (f *bcFn) ProcessBroadcastElement(_ *pipeline.Context[pairOut], r bcRec) error {
	return f.rules.Put(r.Key, r.Val)
}

func (f *bcFn) OnTimer(*pipeline.KeyedContext[int64, pairOut], pipeline.Timer) error { return nil }

// broadcastJob reads one split (the order of rules and events then is the
// input's, in every subtask).
func broadcastJob(job *pipeline.Job, throttle bool) *pipeline.Stream[tally] {
	gen := genBroadcast
	if throttle {
		gen = func(split int, seq uint64) bcRec {
			if seq%3 == 2 {
				time.Sleep(time.Millisecond)
			}
			return genBroadcast(split, seq)
		}
	}
	in := pipeline.FromSource(job, "in", source.NewGenerator(1, twoEvents, gen))
	events := pipeline.Filter(in, "events", func(_ context.Context, r bcRec) (bool, error) { return !r.Rule, nil })
	rules := pipeline.Filter(in, "rules", func(_ context.Context, r bcRec) (bool, error) { return r.Rule, nil })
	outs := pipeline.ProcessKeyedBroadcast(pipeline.KeyBy(events, func(r bcRec) int64 { return r.Key }), pipeline.Broadcast(rules), "apply",
		func() pipeline.KeyedBroadcastProcessFunc[int64, bcRec, bcRec, pairOut] { return &bcFn{} })
	return pipeline.Process(pipeline.KeyBy(outs, func(p pairOut) int64 { return p.Key }), "tally",
		func() pipeline.KeyedProcessFunc[int64, pairOut, tally] { return &tallyFn{} })
}

// twoInputOracle computes job kind's final tallies directly.
func twoInputOracle(kind string) map[int64]tally {
	want := make(map[int64]tally)
	add := func(key int64, h uint64) {
		t := want[key]
		want[key] = tally{Key: key, Count: t.Count + 1, Sum: t.Sum + h}
	}
	if kind == "broadcast" {
		rules := map[int64]uint64{}
		for seq := range uint64(twoEvents) {
			r := genBroadcast(0, seq)
			if r.Rule {
				rules[r.Key] = r.Val
				continue
			}
			add(r.Key, mix(r.Val, rules[int64(r.Val%5)]))
		}
		return want
	}
	as, bs := map[int64][]sideRec{}, map[int64][]sideRec{}
	for s := range twoSplitsA {
		for seq := range uint64(twoPerSplitA) {
			r := genA(s, seq)
			as[r.Key] = append(as[r.Key], r)
		}
	}
	for seq := range uint64(twoPerSplitB) {
		r := genB(0, seq)
		bs[r.Key] = append(bs[r.Key], r)
	}
	for k, xs := range as {
		for _, x := range xs {
			for _, y := range bs[k] {
				var match bool
				if kind == "interval" {
					match = y.TS >= x.TS+int64(ijLower) && y.TS <= x.TS+int64(ijUpper)
				} else {
					match = floorDiv(x.TS, int64(wjSize)) == floorDiv(y.TS, int64(wjSize))
				}
				if match {
					add(k, mix(x.ID, y.ID))
				}
			}
		}
	}
	return want
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// TestE2ETwoInputMetamorphic: each two-input job gives its oracle's
// tallies at parallelism 1, 2 and 4 and with several checkpoint
// intervals (the latest tally per key).
func TestE2ETwoInputMetamorphic(t *testing.T) {
	configs := []struct {
		par      int
		interval time.Duration
	}{{1, 0}, {2, 5 * time.Millisecond}, {4, 20 * time.Millisecond}, {4, 2 * time.Millisecond}}
	if testing.Short() {
		configs = configs[:3]
	}
	for _, kind := range []string{"interval", "window", "broadcast"} {
		want := twoInputOracle(kind)
		if len(want) == 0 {
			t.Fatalf("%s: the oracle has no results", kind)
		}
		for _, c := range configs {
			t.Run(fmt.Sprintf("%s/p=%d/interval=%v", kind, c.par, c.interval), func(t *testing.T) {
				job := pipeline.New("two-input-"+kind, pipeline.CheckpointDir(t.TempDir()),
					pipeline.CheckpointInterval(c.interval), pipeline.DefaultParallelism(c.par))
				var mu sync.Mutex
				got := make(map[int64]tally)
				pipeline.To(twoInputJob(job, kind, false), "sink", sink.NewFunc(func(_ context.Context, v tally) error {
					mu.Lock()
					defer mu.Unlock()
					if v.Count > got[v.Key].Count {
						got[v.Key] = v
					}
					return nil
				}, nil))
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				if err := job.Run(ctx); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				defer mu.Unlock()
				if n, ex := diffMaps(got, want, func(v tally) string { return fmt.Sprint(v) }); n != 0 {
					t.Fatalf("%d of %d keys differ from the oracle (%s)", n, len(want), ex)
				}
			})
		}
	}
}

// buildTwoInputCrashJob builds job kind writing its tallies to a KV sink
// under dir.
func buildTwoInputCrashJob(dir, kind string, par int, control bool) (*pipeline.Job, *sink.KV[tally], error) {
	opts := []pipeline.JobOption{
		pipeline.CheckpointDir(filepath.Join(dir, "job")),
		pipeline.CheckpointInterval(50 * time.Millisecond),
		pipeline.DefaultParallelism(par),
		pipeline.Hooks(&checkpointMarker{path: markerPath(dir)}),
	}
	if control {
		opts = append(opts, jobFaults(failpoint.Pipeline{OffsetsBeforeState: true})...)
	}
	job := pipeline.New("two-input-crash-"+kind, opts...)
	kv, err := sink.NewKV(filepath.Join(dir, "kv"), func(v tally) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v.Key)) },
		func(dst []byte, v tally) ([]byte, error) {
			return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(dst, uint64(v.Count)), v.Sum), nil
		})
	if err != nil {
		return nil, nil, err
	}
	pipeline.To(twoInputJob(job, kind, true), "kv", kv)
	return job, kv, nil
}

// TestTwoInputChild is the job process of the two-input crash tests; it
// does nothing unless started by runTwoInputCrash.
func TestTwoInputChild(t *testing.T) {
	kind := os.Getenv(envTwoChild)
	if kind == "" {
		t.Skip("the two-input crash tests' child process")
	}
	par, _ := strconv.Atoi(os.Getenv(envPar))
	job, kv, err := buildTwoInputCrashJob(os.Getenv(envDir), kind, max(par, 1), os.Getenv(envTwoControl) != "")
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(job.Run(context.Background()), kv.Close()); err != nil {
		t.Fatal(err)
	}
}

// runTwoInputCrash kills job kind's child process kills times (each run
// with a parallelism of 1 to 3), lets it finish and returns the tallies.
func runTwoInputCrash(t *testing.T, kind string, seed uint64, kills int, control bool) map[int64]tally {
	if control {
		requireFailpoints(t)
	}
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(seed, 26))
	start := func() *exec.Cmd {
		return startChildTest(t, "^TestTwoInputChild$", control, envTwoControl, envTwoChild+"="+kind, envDir+"="+dir, envPar+"="+strconv.Itoa(1+rng.IntN(3)))
	}
	killLoop(t, kills, start, func() time.Duration { return time.Duration(100+rng.IntN(400)) * time.Millisecond }, nil, markerPath(dir))
	got := make(map[int64]tally)
	for k, v := range readKV(t, filepath.Join(dir, "kv")) {
		if len(k) != 8 || len(v) != 16 {
			t.Fatalf("bad KV entry %x=%x", k, v)
		}
		key := int64(binary.BigEndian.Uint64([]byte(k)))
		got[key] = tally{Key: key, Count: int64(binary.BigEndian.Uint64([]byte(v))), Sum: binary.BigEndian.Uint64([]byte(v[8:]))}
	}
	return got
}

func twoInputKills() int {
	if testing.Short() {
		return 2
	}
	return 3
}

func twoInputCrash(t *testing.T, kind string, control bool) {
	seed := testSeed(t)
	want := twoInputOracle(kind)
	got := runTwoInputCrash(t, kind, seed, twoInputKills(), control)
	n, ex := diffMaps(got, want, func(v tally) string { return fmt.Sprint(v) })
	if control {
		if n == 0 {
			t.Fatalf("seed %d: the faulty %s job passed the check: the check cannot fail", seed, kind)
		}
		t.Logf("control run failed the check as it must: %d keys differ (%s)", n, ex)
		return
	}
	if n != 0 {
		t.Fatalf("seed %d: %d of %d keys differ from the oracle after crashes (%s)", seed, n, len(want), ex)
	}
	var results int64
	for v := range maps.Values(want) {
		results += v.Count
	}
	t.Logf("%d results over %d keys equal the oracle's after %d kills", results, len(want), twoInputKills())
}

// TestE2EIntervalJoinCrashExactlyOnce: an interval join of two sources
// under repeated SIGKILL (parallelism changing between restarts) gives
// exactly the oracle's pairs.
func TestE2EIntervalJoinCrashExactlyOnce(t *testing.T) { twoInputCrash(t, "interval", false) }

// TestE2EIntervalJoinCrashControl proves the check can fail: with offsets
// checkpointed behind the state, restores join records twice.
func TestE2EIntervalJoinCrashControl(t *testing.T) { twoInputCrash(t, "interval", true) }

// TestE2EWindowJoinCrashExactlyOnce: a tumbling window join under
// repeated SIGKILL gives exactly the oracle's pairs.
func TestE2EWindowJoinCrashExactlyOnce(t *testing.T) { twoInputCrash(t, "window", false) }

// TestE2EWindowJoinCrashControl: the faulty job fails the window join's
// check.
func TestE2EWindowJoinCrashControl(t *testing.T) { twoInputCrash(t, "window", true) }

// TestE2EBroadcastCrashExactlyOnce: broadcast rules applied by a keyed
// operator under repeated SIGKILL (and changing parallelism: the rules are
// restored on every subtask) give exactly the oracle's results.
func TestE2EBroadcastCrashExactlyOnce(t *testing.T) { twoInputCrash(t, "broadcast", false) }

// TestE2EBroadcastCrashControl: the faulty job fails the broadcast check.
func TestE2EBroadcastCrashControl(t *testing.T) { twoInputCrash(t, "broadcast", true) }
