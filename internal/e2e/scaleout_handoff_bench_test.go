package e2e

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// envSO1GB enables BenchmarkScaleoutHandoff's 1 GB row (so does a -bench
// pattern naming it, e.g. BENCH='ScaleoutHandoff/state=1GB' make bench).
const envSO1GB = "RUNNEL_BENCH_SO_1GB"

const soValueSize = 1 << 10 // bytes of state per key

// BenchmarkScaleoutHandoff measures the hand-off of one task holding
// 100 MB (and, when asked for, 1 GB) of keyed state — 1 KiB of
// incompressible bytes per key, 100k (1M) keys, a pre-partitioned keyed
// stage on a 1-queue topic, so one task holds it all — to a worker with
// an empty disk and no standby (standbys=0), which rebuilds it from the
// broker, and to the worker keeping its standby copy (standbys=1). Two
// worker processes run the job; once the owner has every key's state (and
// its latest snapshot is in the changelog) it is SIGKILLed and a few
// records for known keys are sent; the other worker takes the task,
// restores it and processes them, finding each key's state (it fails
// otherwise). handoff-s is from the kill to that first record; restore-s,
// restore-bytes-MB and restore-MB/s are the new owner's restore (its
// /status: the snapshot and the changelog segments after it, read from the
// broker and loaded into Pebble; with a standby, the copy's lag);
// detect-claim-s the time before it (the broker noticing the dead worker,
// the rebalance, the claim). Where a rebuild's time goes is then measured
// here (standbys=0), on the same broker data, step
// by step: broker-read-s (pulling the snapshot's and segments' chunks),
// savepoint-restore-s (checkpoint.RestoreSavepoint of the snapshot from a
// local file: batches), savepoint-ingest-s (checkpoint.IngestSavepoint of
// the same file: sstables, what a restore does) and batch-apply-s
// (checkpoint.Store.ApplyBatch of the segments on the ingested store). MB are MiB; ns/op is the whole op (filling the state too).
// The 1 GB row needs about 8 GB of disk and minutes:
// it runs only with RUNNEL_BENCH_SO_1GB=1 or a -bench pattern naming it.
func BenchmarkScaleoutHandoff(b *testing.B) {
	sb := startSOBroker(b)
	seq := 0
	for _, sz := range []struct {
		name string
		mb   int
	}{{"100MB", 100}, {"1GB", 1024}} {
		for _, standbys := range []int{0, 1} {
			b.Run(fmt.Sprintf("state=%s/standbys=%d", sz.name, standbys), func(b *testing.B) {
				if sz.mb >= 1024 && !soWant1GB() {
					b.Skipf("1 GB of state takes minutes and ~8 GB of disk: set %s=1 or name it in -bench (BENCH='ScaleoutHandoff/state=1GB' make bench)", envSO1GB)
				}
				var sum soHandoffResult
				for range b.N {
					seq++
					sum.add(runSOHandoff(b, sb, seq, sz.mb<<20/soValueSize, standbys))
				}
				sum.report(b, b.N, standbys == 0)
			})
		}
	}
}

func soWant1GB() bool {
	if os.Getenv(envSO1GB) != "" {
		return true
	}
	f := flag.Lookup("test.bench")
	return f != nil && strings.Contains(f.Value.String(), "1GB")
}

type soHandoffResult struct {
	handoff, restore, detectClaim  time.Duration
	restoreBytes                   int64
	read, savepoint, ingest, apply time.Duration
	readBytes                      int64
	snapshotBytes, segmentBytes    int64
	segments                       int
}

func (r *soHandoffResult) add(o soHandoffResult) {
	r.handoff += o.handoff
	r.restore += o.restore
	r.detectClaim += o.detectClaim
	r.restoreBytes += o.restoreBytes
	r.read += o.read
	r.savepoint += o.savepoint
	r.ingest += o.ingest
	r.apply += o.apply
	r.readBytes += o.readBytes
	r.snapshotBytes += o.snapshotBytes
	r.segmentBytes += o.segmentBytes
	r.segments += o.segments
}

func (r *soHandoffResult) report(b *testing.B, n int, steps bool) {
	f := float64(n)
	mb := func(x int64) float64 { return float64(x) / (1 << 20) }
	b.ReportMetric(r.handoff.Seconds()/f, "handoff-s")
	b.ReportMetric(r.restore.Seconds()/f, "restore-s")
	b.ReportMetric(r.detectClaim.Seconds()/f, "detect-claim-s")
	b.ReportMetric(mb(r.restoreBytes)/f, "restore-bytes-MB")
	b.ReportMetric(mb(r.restoreBytes)/r.restore.Seconds(), "restore-MB/s")
	if !steps {
		return
	}
	b.ReportMetric(r.read.Seconds()/f, "broker-read-s")
	b.ReportMetric(mb(r.readBytes)/r.read.Seconds(), "broker-read-MB/s")
	b.ReportMetric(r.savepoint.Seconds()/f, "savepoint-restore-s")
	b.ReportMetric(r.ingest.Seconds()/f, "savepoint-ingest-s")
	b.ReportMetric(r.apply.Seconds()/f, "batch-apply-s")
	b.ReportMetric(mb(r.snapshotBytes)/f, "snapshot-MB")
	b.ReportMetric(mb(r.segmentBytes)/f, "segments-MB")
	b.ReportMetric(float64(r.segments)/f, "segments")
}

func runSOHandoff(b *testing.B, sb *soBroker, seq, keys, standbys int) soHandoffResult {
	b.Helper()
	job := fmt.Sprintf("so_hand_%d_s%d", seq, standbys)
	in := job + "_in"
	sb.createTopic(b, in, 1)
	dir := b.TempDir()
	cfg := func(name string) soChildConfig {
		return soChildConfig{Role: "handoff", Namesrv: sb.ns, Dir: filepath.Join(dir, name), Instance: job + "-" + name,
			Job: job, In: in, Interval: time.Second, Keys: keys, ValueSize: soValueSize, Standbys: standbys}
	}
	procs := []*soProc{startSOProc(b, job+"-a", cfg("a")), startSOProc(b, job+"-b", cfg("b"))}
	addrs := []string{procs[0].line(b, soLineStatus, time.Minute)[0], procs[1].line(b, soLineStatus, time.Minute)[0]}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	route, err := sb.c.RefreshRoute(ctx, in)
	if err != nil {
		b.Fatal(err)
	}
	q := route.SubscribeQueues()[0]
	task := scaleout.TaskID{Stage: soHandoffSource, Broker: q.BrokerName, Queue: q.QueueID}.String()
	// Who owns the task once both have joined: the same worker in ten
	// looks 300 ms apart (the first to join may hand it to the second).
	owner, same := -1, 0
	deadline := time.Now().Add(2 * time.Minute)
	for same < 10 {
		running := -1
		for i, a := range addrs {
			st, err := workerStatus(ctx, a)
			if err != nil {
				b.Fatal(err)
			}
			if len(st.Tasks) == 1 && st.Tasks[0].State == "running" {
				if running >= 0 {
					running = -2
				} else if running == -1 {
					running = i
				}
			}
		}
		switch {
		case running >= 0 && running == owner:
			same++
		case running >= 0:
			owner, same = running, 1
		default:
			owner, same = -1, 0
		}
		if time.Now().After(deadline) {
			b.Fatalf("task %s not running steadily on one of the two workers after 2 minutes", task)
		}
		time.Sleep(300 * time.Millisecond)
	}
	next := 1 - owner
	// The input: every key once.
	p, err := client.NewProducer(sb.c, job+"_input")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	sendKeys := func(from, to int) {
		const batch = 256
		msgs := make([]*client.Message, 0, batch)
		for k := from; k < to; {
			msgs = msgs[:0]
			for ; k < to && len(msgs) < batch; k++ {
				msgs = append(msgs, &client.Message{Topic: in, Body: binary.BigEndian.AppendUint64(nil, uint64(k)), Queue: &q})
			}
			if _, err := p.Send(ctx, msgs...); err != nil {
				b.Fatal(err)
			}
		}
	}
	start := time.Now()
	sendKeys(0, keys)
	procs[owner].line(b, soLineFilled, 30*time.Minute)
	b.Logf("%s: %d keys of %d B state filled in %v", job, keys, soValueSize, time.Since(start).Round(time.Millisecond))
	// Quiescent: no snapshot being written (the changelog queue grows by
	// at most one small segment per checkpoint), then one more checkpoint,
	// whose record names the latest snapshot.
	fol := scaleout.NewFollower(sb.c, job, nil)
	defer fol.Close()
	commitQ := protocol.MessageQueue{Topic: scaleout.TopicName(job, soHandoffSource, scaleout.KindCommit), BrokerName: q.BrokerName, QueueID: q.QueueID}
	changeQ := protocol.MessageQueue{Topic: scaleout.TopicName(job, soHandoffSource, scaleout.KindChangelog), BrokerName: q.BrokerName, QueueID: q.QueueID}
	fol.Follow(task, commitQ)
	if err := fol.Ready(ctx, task); err != nil {
		b.Fatal(err)
	}
	last, err := sb.c.MaxOffset(ctx, changeQ)
	if err != nil {
		b.Fatal(err)
	}
	for {
		time.Sleep(3 * time.Second)
		m, err := sb.c.MaxOffset(ctx, changeQ)
		if err != nil {
			b.Fatal(err)
		}
		if m-last <= 4 {
			break
		}
		last = m
	}
	v, err := fol.View(task)
	if err != nil || v.Latest == nil {
		b.Fatalf("chain of %s: %v", task, err)
	}
	seen := v.Latest.Seq
	for {
		time.Sleep(200 * time.Millisecond)
		if v, err = fol.View(task); err != nil {
			b.Fatal(err)
		}
		if v.Latest.Seq > seen+1 {
			break
		}
	}
	base := v.Latest
	if standbys > 0 { // the copy has caught up
		deadline := time.Now().Add(10 * time.Minute)
		for {
			st, err := workerStatus(ctx, addrs[next])
			if err != nil {
				b.Fatal(err)
			}
			if len(st.Standbys) == 1 && st.Standbys[0].At >= base.Seq {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: the standby did not reach checkpoint %d in 10 minutes: %+v", job, base.Seq, st.Standbys)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The hand-off.
	t0 := time.Now()
	procs[owner].kill()
	sendKeys(0, 10)
	f := procs[next].line(b, soLineFirst, 30*time.Minute)
	firstNs, _ := strconv.ParseInt(f[0], 10, 64)
	if f[1] != "true" {
		b.Fatalf("%s: the new owner's first record found no state for its key", job)
	}
	var r soHandoffResult
	r.handoff = time.Unix(0, firstNs).Sub(t0)
	st, err := workerStatus(ctx, addrs[next])
	if err != nil {
		b.Fatal(err)
	}
	if len(st.Tasks) != 1 || st.Tasks[0].Restore == nil {
		b.Fatalf("%s: the new owner's status has no restored task: %+v", job, st.Tasks)
	}
	rs := st.Tasks[0].Restore
	if standbys == 0 && (rs.Reused || !rs.FromSnapshot) {
		b.Fatalf("%s: the new owner restored %+v, want a rebuild from the broker's snapshot", job, rs)
	}
	if standbys > 0 && !rs.Reused {
		b.Fatalf("%s: the new owner restored %+v, want its standby copy reused", job, rs)
	}
	r.restore, r.restoreBytes = rs.Duration, rs.Bytes
	for _, h := range st.Handoffs {
		if h.Task == task && h.Event == "claimed" && h.Time.After(t0) {
			r.detectClaim = h.Time.Sub(t0)
		}
	}
	b.Logf("%s: handed off in %v: restore %v of %d MiB (snapshot of checkpoint %d + %d segments), claimed after %v",
		job, r.handoff.Round(time.Millisecond), r.restore.Round(time.Millisecond), rs.Bytes>>20, base.Snapshot.Seq, rs.Segments, r.detectClaim.Round(time.Millisecond))
	procs[next].stop(b, 5*time.Minute)
	if standbys == 0 {
		soRestoreSteps(b, ctx, sb.c, job, task, changeQ, base, dir, &r)
	}
	return r
}

// soRestoreSteps times a restore's steps one by one on base's snapshot
// and segments: reading them from the broker, loading the snapshot into a
// new store, applying the segments.
func soRestoreSteps(b *testing.B, ctx context.Context, c *client.Client, job, task string, changeQ protocol.MessageQueue, base *scaleout.Record, dir string, r *soHandoffResult) {
	b.Helper()
	snapFile := filepath.Join(dir, "snapshot")
	fh, err := os.Create(snapFile)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	sr := scaleout.NewSegmentReader(ctx, c, job, changeQ, task, base.Snapshot)
	n, err := io.Copy(fh, sr)
	_ = sr.Close()
	if err != nil {
		b.Fatal(err)
	}
	var segs [][]byte
	for _, s := range base.Segments {
		if s.Seq <= base.Snapshot.Seq {
			continue
		}
		data, err := scaleout.ReadSegment(ctx, c, job, changeQ, task, s)
		if err != nil {
			b.Fatal(err)
		}
		segs = append(segs, data)
		r.segmentBytes += int64(len(data))
	}
	r.read = time.Since(start)
	r.snapshotBytes, r.segments = n, len(segs)
	r.readBytes = n + r.segmentBytes
	if _, err := fh.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
	store := filepath.Join(dir, "restored")
	start = time.Now()
	if err := checkpoint.RestoreSavepoint(ctx, store, fh, checkpoint.Options{}); err != nil {
		b.Fatal(err)
	}
	r.savepoint = time.Since(start)
	if _, err := fh.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	if err := checkpoint.IngestSavepoint(ctx, filepath.Join(dir, "ingested"), fh, checkpoint.Options{}); err != nil {
		b.Fatal(err)
	}
	r.ingest = time.Since(start)
	_ = fh.Close()
	start = time.Now()
	s, err := checkpoint.Open(filepath.Join(dir, "ingested"), checkpoint.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for i, data := range segs {
		if _, err := s.ApplyBatch(data, false); err != nil {
			b.Fatalf("apply segment %d: %v", i, err)
		}
	}
	m, ok := s.Latest()
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	r.apply = time.Since(start)
	if !ok || m.ID != base.Seq {
		b.Fatalf("restored to checkpoint %d, want %d", m.ID, base.Seq)
	}
}
