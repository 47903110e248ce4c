package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

const chromiumPath = "/usr/bin/chromium"

// TestStatusPageInChromium runs a live word-count job over the embedded
// broker (a producer keeps sending lines, a few of them undecodable, so the
// job has lag, throughput, checkpoints and dead letters), loads its status
// page in headless Chromium after the page's JS has polled, and asserts the
// rendered DOM: graph nodes and edges, split rows with numeric lag,
// completed checkpoint rows and the dead-letter row. A screenshot is saved
// under the test's temp dir (its path is logged).
func TestStatusPageInChromium(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Skipf("SKIP: %s not installed (Debian: apt-get install -y chromium); the status page is not tested in a browser", chromiumPath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const topic = "clicks"
	cl := embedded.Run(t, embedded.WithTopic(topic, 3))
	c, err := cl.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// The producer: lines of sample text, every 25th one not decodable.
	p, err := client.NewProducer(c, "page_test")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Registered after p.Close, so it runs first: the sending goroutine
	// stops before its producer closes (the other order failed the test
	// with "client: closed" when a send was in flight at the end).
	prodCtx, stopProd := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopProd(); wg.Wait() }()
	wg.Go(func() {
		lines := wordcount.SampleLines(100000, 7)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; prodCtx.Err() == nil; i++ {
			body := lines[i%len(lines)]
			if i%25 == 24 {
				body = "\xffnot text"
			}
			if _, err := p.Send(prodCtx, &client.Message{Topic: topic, Body: []byte(body)}); err != nil && prodCtx.Err() == nil {
				t.Errorf("produce: %v", err)
				return
			}
			if i%5 == 4 {
				select {
				case <-prodCtx.Done():
				case <-tick.C:
				}
			}
		}
	})

	src, err := rocketmq.New(c, topic)
	if err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	job := pipeline.New("clickstream", pipeline.CheckpointInterval(400*time.Millisecond), pipeline.DefaultParallelism(2),
		pipeline.StatusAddress("127.0.0.1:0", func(a string) { addrc <- a }))
	var dlq sync.Map
	lines := pipeline.FromSourceDecoded(job, topic, src, func(m rocketmq.Message) (string, error) {
		if !isText(m.Body) {
			return "", fmt.Errorf("body at %s/%d offset %d is not UTF-8 text", m.BrokerName, m.QueueID, m.QueueOffset)
		}
		return string(m.Body), nil
	}, pipeline.OnBadRecord(pipeline.DeadLetter("bad-lines", sink.NewFunc(func(_ context.Context, d sink.DeadLetter) error {
		dlq.Store(d.Reason, true)
		return nil
	}, nil))))
	words := pipeline.FlatMap(lines, "split", func(_ context.Context, l string, c *pipeline.Collector[string]) error {
		for _, w := range wordcount.Words(l) {
			c.Emit(w)
		}
		return nil
	})
	counts := pipeline.Reduce(pipeline.KeyBy(pipeline.Map(words, "pair", func(_ context.Context, w string) (wordcount.WordCount, error) {
		return wordcount.WordCount{Word: w, Count: 1}, nil
	}), func(wc wordcount.WordCount) string { return wc.Word }), "count", func(_ context.Context, a, b wordcount.WordCount) (wordcount.WordCount, error) {
		return wordcount.WordCount{Word: a.Word, Count: a.Count + b.Count}, nil
	})
	pipeline.To(counts, "counts-out", sink.NewFunc(func(context.Context, wordcount.WordCount) error { return nil }, nil))

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
	base := "http://" + addr

	// Wait until the job has live numbers to show.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var doc runtime.StatusDocument
		var h runtime.StatusHistory
		err := errors.Join(getJSON(base+"/status", &doc), getJSON(base+"/status/history", &h))
		completed := 0
		for _, cp := range doc.Checkpoints {
			if cp.Result == "completed" {
				completed++
			}
		}
		lagKnown := 0
		for _, l := range doc.Lag {
			if l.Lag >= 0 {
				lagKnown++
			}
		}
		if err == nil && completed >= 3 && lagKnown == 3 && len(doc.DeadLetters) > 0 && len(h.Samples) >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job status never got live: err %v, %d checkpoints, lag %+v, %d dead letters, %d samples",
				err, completed, doc.Lag, len(doc.DeadLetters), len(h.Samples))
		}
		time.Sleep(100 * time.Millisecond)
	}

	dir := t.TempDir()
	chrome := func(args ...string) []byte {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 100*time.Second)
		defer ccancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
			"--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
			"--user-data-dir=" + filepath.Join(dir, "profile"), "--virtual-time-budget=5000"}
		cmd := exec.CommandContext(cctx, chromiumPath, append(base, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}
	dom := string(chrome("--dump-dom", base+"/ui/"))

	// The graph: every operator as a node, the keyed and dead-letter edges.
	for _, uid := range []string{topic, "split", "pair", "count", "counts-out", "bad-lines"} {
		if !strings.Contains(dom, `data-uid="`+uid+`"`) {
			t.Errorf("graph lacks node %s", uid)
		}
	}
	for _, re := range []string{
		`<g class="node source" transform="[^"]+" data-uid="clicks">`,
		`class="edge keyed"[^>]*data-from="pair" data-to="count"`,
		`class="edge dead-letter"[^>]*data-from="clicks" data-to="bad-lines"`,
		`class="edge forward"[^>]*data-from="count" data-to="counts-out"`,
		`<h1 id="job">clickstream</h1>`, `<span id="state" class="pill running">running</span>`,
		// Charts drew lines.
		`<path class="line" d="M[^"]+" stroke="#[0-9a-f]+" data-series="clicks/broker-a/0">`,
		`<path class="line" d="M[^"]+" stroke="#[0-9a-f]+" data-series="clicks">`,
	} {
		if !regexp.MustCompile(re).MatchString(dom) {
			t.Errorf("DOM lacks %s", re)
		}
	}
	// Split rows with numeric lag, checkpoint rows with ids, durations and
	// sizes, the dead letter with its error, a non-zero throughput.
	splitRow := regexp.MustCompile(`<tr data-split="clicks/(broker-a/\d)"><td>clicks</td><td>broker-a/\d</td><td class="num lag">([\d,]+)</td><td class="wm[^"]*">[^<]*</td><td class="mono">next \d+</td></tr>`)
	if m := splitRow.FindAllStringSubmatch(dom, -1); len(m) != 3 {
		t.Errorf("split rows: %d, want 3 with numeric lag", len(m))
	}
	cpRow := regexp.MustCompile(`<tr data-id="(\d+)"><td class="num">\d+</td><td>\d\d:\d\d:\d\d</td><td class="num">[\d.]+ (µs|ms|s)</td><td class="num">[\d.]+ (B|KiB|MiB)</td><td class="num">[\d,]+</td><td class="res completed">completed</td></tr>`)
	cps := cpRow.FindAllStringSubmatch(dom, -1)
	if len(cps) < 3 {
		t.Errorf("completed checkpoint rows: %d, want ≥ 3", len(cps))
	} else if id, _ := strconv.Atoi(cps[0][1]); id < 3 {
		t.Errorf("newest checkpoint row is #%d", id)
	}
	if !regexp.MustCompile(`<td>clicks</td><td>dead-letter</td><td>decode</td><td class="err">[^<]*is not UTF-8 text</td>`).MatchString(dom) {
		t.Error("no dead-letter row")
	}
	if m := regexp.MustCompile(`<div class="value" id="sum-read">([\d,]+)</div>`).FindStringSubmatch(dom); m == nil || m[1] == "0" {
		t.Errorf("records read not shown: %v", m)
	}
	if m := regexp.MustCompile(`<div class="value" id="sum-rate">([\d.k]+) rec/s</div>`).FindStringSubmatch(dom); m == nil || m[1] == "0" {
		t.Errorf("throughput not shown: %v", m)
	}

	shot := filepath.Join(dir, "status-page.png")
	chrome("--screenshot="+shot, "--window-size=1280,1500", base+"/ui/")
	st, err := os.Stat(shot)
	if err != nil || st.Size() < 20<<10 {
		t.Fatalf("screenshot %s: %v (%d bytes)", shot, err, func() int64 {
			if st != nil {
				return st.Size()
			}
			return 0
		}())
	}
	t.Logf("status page screenshot: %s (%d bytes)", shot, st.Size())
	if keep := os.Getenv("RUNNEL_TEST_ARTIFACTS"); keep != "" {
		if b, err := os.ReadFile(shot); err == nil {
			_ = os.WriteFile(filepath.Join(keep, "status-page.png"), b, 0o644) // best effort: an artifact copy
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}
}

func getJSON(url string, v any) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func isText(b []byte) bool { return strings.ToValidUTF8(string(b), "\ufffd") == string(b) }
