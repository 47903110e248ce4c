package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/testutil"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

type pageEvent struct {
	Key string    `json:"key" validate:"required"`
	TS  time.Time `json:"ts"`
}

// TestStatusPageWatermarksInChromium runs a job of two event-time windows
// over the embedded broker and checks, in the DOM headless Chromium
// renders, what a newcomer needs to see why windows fire or not:
//   - "per-user" reads topic clicks with an idle timeout: its quiet queue
//     is shown idle, the operator shows its watermark, and clicks sent
//     after their windows expired show as late records (operator row and
//     summary card);
//   - "per-page" reads topic views without one: its empty queue holds the
//     operator's watermark back, shown as "none yet", held back by
//     views/broker-a/1 with no watermark.
//
// Both sources read message bodies (FromBytes), whose lag the page shows
// as numbers, with checkpointed offsets decoded ("next N").
func TestStatusPageWatermarksInChromium(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("SKIP: %s not installed (Debian: apt-get install -y chromium); the status page is not tested in a browser", chromiumPath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := embedded.Run(t, embedded.WithTopic("clicks", 2), embedded.WithTopic("views", 2))
	c := cl.Client()
	p, err := client.NewProducer(c, "wm_page_test")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	base := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	send := func(topic, key string, sec ...int) { // to queue 0 only
		t.Helper()
		r, err := c.RefreshRoute(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		q := protocol.MessageQueue{Topic: topic, BrokerName: r.BrokerNames()[0], QueueID: 0}
		for _, s := range sec {
			body := fmt.Sprintf(`{"key":%q,"ts":%q}`, key, base.Add(time.Duration(s)*time.Second).Format(time.RFC3339))
			if _, err := p.Send(ctx, &client.Message{Topic: topic, Queue: &q, Body: []byte(body)}); err != nil {
				t.Fatal(err)
			}
		}
	}

	addrc := make(chan string, 1)
	job := pipeline.New("watermarks", pipeline.CheckpointInterval(300*time.Millisecond), pipeline.DefaultParallelism(1),
		pipeline.StatusAddress("127.0.0.1:0", func(a string) { addrc <- a }))
	discard := sink.NewFunc(func(context.Context, window.Result[string, int64]) error { return nil }, nil)
	for _, s := range []struct {
		topic, op string
		idle      time.Duration
	}{{"clicks", "per-user", 300 * time.Millisecond}, {"views", "per-page", 0}} {
		src, err := rocketmq.New(c, s.topic)
		if err != nil {
			t.Fatal(err)
		}
		var opts []pipeline.SourceOption
		if s.idle > 0 {
			opts = append(opts, pipeline.IdleTimeout(s.idle))
		}
		in := pipeline.FromBytes(job, s.topic, src.Bytes(), pipeline.JSON[pageEvent](), opts...).
			WithTimestamps(func(e pageEvent) time.Time { return e.TS })
		counts := window.Apply(pipeline.KeyBy(in, func(e pageEvent) string { return e.Key }), s.op,
			window.Tumbling(10*time.Second), window.Count[pageEvent]())
		pipeline.To(counts, s.op+"-out", discard)
	}
	jobCtx, stopJob := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- job.Run(jobCtx) }()
	defer func() {
		stopJob()
		if err := <-errc; err != nil {
			t.Errorf("job: %v", err)
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("job ended: %v", err)
	}

	send("clicks", "ann", 1, 4, 12, 31)
	send("views", "/home", 2, 14)
	// Once clicks' quiet queue is idle, per-user's watermark passes 12:00:30;
	// then two clicks for expired windows are late.
	op := func(doc runtime.StatusDocument, uid string) runtime.OperatorStatus {
		for _, o := range doc.Operators {
			if o.UID == uid {
				return o
			}
		}
		return runtime.OperatorStatus{}
	}
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		var doc runtime.StatusDocument
		if err := getJSON("http://"+addr+"/status", &doc); err != nil {
			return err
		}
		if o := op(doc, "per-user"); o.Watermark == nil || o.Watermark.Before(base.Add(30*time.Second)) {
			return fmt.Errorf("per-user watermark %v", o.Watermark)
		}
		return nil
	})
	send("clicks", "ann", 3, 5)
	var doc runtime.StatusDocument
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		doc = runtime.StatusDocument{}
		if err := getJSON("http://"+addr+"/status", &doc); err != nil {
			return err
		}
		if o := op(doc, "per-user"); o.Late != 2 {
			return fmt.Errorf("per-user: %d late records", o.Late)
		}
		if o := op(doc, "per-page"); len(o.HeldBy) != 1 || o.HeldBy[0].Split != "broker-a/1" {
			return fmt.Errorf("per-page held by %+v", o.HeldBy)
		}
		if len(doc.Splits) != 4 {
			return fmt.Errorf("%d checkpointed splits", len(doc.Splits))
		}
		for _, l := range doc.Lag {
			if l.Lag < 0 {
				return fmt.Errorf("split %s/%s: lag unknown", l.Source, l.Split)
			}
		}
		return nil
	})

	dir := t.TempDir()
	chrome := func(args ...string) []byte {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
		defer ccancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
			"--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
			"--user-data-dir=" + filepath.Join(dir, "profile"), "--virtual-time-budget=3000"}
		cmd := exec.CommandContext(cctx, chromiumPath, append(base, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}
	dom := string(chrome("--dump-dom", "http://"+addr+"/ui/"))
	for _, re := range []string{
		// per-user: its watermark, its two late records, nothing holding it (all idle).
		`<tr data-uid="per-user"><td>per-user</td><td>keyed-process</td><td class="num">6</td><td class="num">\d+</td><td class="num">0</td>` +
			`<td class="num late some">2</td><td class="num">[^<]*</td><td class="wm">2025-05-01 12:00:30\.999 UTC</td><td class="held">–</td></tr>`,
		`<div class="value" id="sum-late">2</div>`,
		// clicks' quiet queue is idle; its splits show numeric lag and decoded offsets.
		`<tr data-split="clicks/broker-a/1" data-idle="true"><td>clicks</td><td>broker-a/1</td><td class="num lag">0</td><td class="wm none">none yet<span class="tag idle">idle</span></td><td class="mono">next 0</td></tr>`,
		`<tr data-split="clicks/broker-a/0"( data-idle="true")?><td>clicks</td><td>broker-a/0</td><td class="num lag">\d+</td><td class="wm">2025-05-01 12:00:30\.999 UTC(<span class="tag idle">idle</span>)?</td><td class="mono">next 6</td></tr>`,
		// per-page: no watermark, held back by the empty, active views queue.
		`<tr data-uid="per-page"><td>per-page</td>.*?<td class="wm none">none yet</td><td class="held"><span class="holder" data-split="views/broker-a/1">views/broker-a/1<span class="tag nowm">no watermark</span></span></td></tr>`,
		`<tr data-split="views/broker-a/0"><td>views</td><td>broker-a/0</td><td class="num lag">\d+</td><td class="wm">2025-05-01 12:00:13\.999 UTC</td><td class="mono">next 2</td></tr>`,
	} {
		if !regexp.MustCompile(re).MatchString(dom) {
			t.Errorf("DOM lacks %s", re)
		}
	}
	shot := filepath.Join(dir, "status-page-watermarks.png")
	chrome("--screenshot="+shot, "--window-size=1280,1500", "http://"+addr+"/ui/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 20<<10 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("status page screenshot: %s", shot)
	if keep := os.Getenv("RUNNEL_TEST_ARTIFACTS"); keep != "" {
		if b, err := os.ReadFile(shot); err == nil {
			_ = os.WriteFile(filepath.Join(keep, "status-page-watermarks.png"), b, 0o644) // best effort: an artifact copy
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", strings.ReplaceAll(dom, "<tr", "\n<tr"))
	}
}
