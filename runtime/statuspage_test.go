package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStatusPageRoutes runs an engine with a status endpoint and checks every
// route: /status (graph, lag, dead letters newest first and bounded), the
// history ring, the embedded page and its assets, and / for browsers and for
// JSON clients.
func TestStatusPageRoutes(t *testing.T) {
	e, err := New(Config{Name: "page", Interval: 5 * time.Millisecond, StatusAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	e.SetGraph(Graph{
		Nodes: []GraphNode{{UID: "src", Kind: "source", Parallelism: 2}, {UID: "out", Kind: "sink", Parallelism: 1}},
		Edges: []GraphEdge{{From: "src", To: "out", Kind: "forward"}},
	})
	e.Operator("src", "source").Out.Add(42)
	e.Split("src", "q0").Lag.Store(7)
	e.Split("src", "q1") // unknown lag: -1, left out of samples
	for i := range StatusDeadLetters + 5 {
		e.RecordDeadLetter(DeadLetterStatus{Operator: "src", Policy: "skip", Reason: "decode", Error: fmt.Sprintf("bad %d", i) + strings.Repeat("x", i*20)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if _, err := e.AddTask("src/q0", SourceTask, offsetTask(-1)); err != nil {
		t.Fatal(err)
	}
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	base := "http://" + e.StatusAddr()
	get := func(path, accept string) (string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s\n%s", path, resp.Status, b)
		}
		return string(b), resp.Header.Get("Content-Type")
	}

	var doc StatusDocument
	body, ctype := get("/status", "")
	if err := json.Unmarshal([]byte(body), &doc); err != nil || !strings.HasPrefix(ctype, "application/json") {
		t.Fatalf("/status: %v %s\n%s", err, ctype, body)
	}
	if doc.Job != "page" || doc.Graph == nil || len(doc.Graph.Edges) != 1 || doc.Graph.Nodes[0].Parallelism != 2 {
		t.Fatalf("graph: %+v", doc.Graph)
	}
	if len(doc.Lag) != 2 || doc.Lag[0] != (SplitLag{Source: "src", Split: "q0", Lag: 7}) || doc.Lag[1].Lag != -1 {
		t.Fatalf("lag: %+v", doc.Lag)
	}
	if len(doc.DeadLetters) != StatusDeadLetters || !strings.HasPrefix(doc.DeadLetters[0].Error, fmt.Sprintf("bad %d", StatusDeadLetters+4)) ||
		!strings.HasPrefix(doc.DeadLetters[StatusDeadLetters-1].Error, "bad 5x") {
		t.Fatalf("dead letters: %d, first %q", len(doc.DeadLetters), doc.DeadLetters[0].Error)
	}
	for _, d := range doc.DeadLetters {
		if len(d.Error) > maxDeadLetterError+len("…") {
			t.Fatalf("dead letter error of %d bytes not truncated", len(d.Error))
		}
	}
	// / is JSON for clients that do not ask for HTML (back compatible).
	body, _ = get("/", "")
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Job != "page" {
		t.Fatalf("/ as JSON: %v\n%s", err, body)
	}
	// Browsers get the page.
	body, ctype = get("/", "text/html,application/xhtml+xml")
	if !strings.Contains(body, `<svg id="graph"`) || !strings.HasPrefix(ctype, "text/html") {
		t.Fatalf("/ for a browser: %s\n%s", ctype, body)
	}
	if js, ctype := get("/ui/app.js", ""); !strings.Contains(js, "function drawGraph") || !strings.Contains(ctype, "javascript") {
		t.Fatalf("app.js: %s", ctype)
	}
	if css, _ := get("/ui/style.css", ""); !strings.Contains(css, ".chart") {
		t.Fatal("style.css")
	}
	// The history: samples with the lag of q0 and the counter of src.
	var h StatusHistory
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, _ = get("/status/history", "")
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			t.Fatal(err)
		}
		if len(h.Samples) >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h.IntervalMs != 1000 || len(h.Samples) == 0 || h.Samples[0].Lag["src/q0"] != 7 || h.Samples[0].Out["src"] != 42 {
		t.Fatalf("history %+v", h)
	}
	if _, ok := h.Samples[0].Lag["src/q1"]; ok {
		t.Fatal("a split with unknown lag was sampled")
	}
}

// TestStatusHistoryRing fills the ring past its bound and checks it keeps
// the newest StatusSamples samples, oldest first.
func TestStatusHistoryRing(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	o := e.Operator("op", "map")
	start := time.UnixMilli(1_000_000)
	for i := range StatusSamples + 7 {
		o.In.Store(int64(i))
		e.sample(start.Add(time.Duration(i) * time.Second))
	}
	h := e.statusHistory()
	if len(h.Samples) != StatusSamples || h.Samples[0].In["op"] != 7 || h.Samples[StatusSamples-1].In["op"] != StatusSamples+6 {
		t.Fatalf("ring: %d samples, first %v, last %v", len(h.Samples), h.Samples[0].In, h.Samples[len(h.Samples)-1].In)
	}
	for i := 1; i < len(h.Samples); i++ {
		if h.Samples[i].Time <= h.Samples[i-1].Time {
			t.Fatalf("samples out of order at %d", i)
		}
	}
}

func BenchmarkStatusSample(b *testing.B) {
	e, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for i := range 16 {
		e.Operator(fmt.Sprint("op", i), "map")
		e.Split("src", fmt.Sprint("q", i)).Lag.Store(int64(i))
	}
	b.ReportAllocs()
	now := time.Now()
	for b.Loop() {
		e.sample(now)
	}
}
