package runtime

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The status endpoint (Config.StatusAddr) serves:
//
//	GET /status          StatusDocument as JSON (the stable, documented path)
//	GET /status/history  the sampled lag and record counters (StatusHistory)
//	GET /ui/             the status page: HTML, JS and CSS embedded in the binary
//	GET /                the page for browsers (Accept: text/html, redirected
//	                     to /ui/), the JSON of /status for every other client
//
// The page polls the two JSON paths every second and draws the job graph,
// per-split lag and per-operator throughput charts (from a bounded ring of
// samples the Engine takes every StatusSampleInterval), the checkpoint
// history and the recent dead letters. It uses no CDN or external asset.

//go:embed web
var webFS embed.FS // read-only: the embedded page

const (
	// StatusSampleInterval is how often a job serving its status samples
	// split lag and operator counters for the page's charts.
	StatusSampleInterval = time.Second
	// StatusSamples bounds the ring of samples (10 minutes at one per
	// second).
	StatusSamples = 600
	// StatusDeadLetters bounds the recent dead letters kept for the page.
	StatusDeadLetters = 50
	// maxDeadLetterError bounds one dead letter's error text.
	maxDeadLetterError = 512
)

// Graph is the job's operator graph: what the status page draws.
type Graph struct {
	Nodes []GraphNode `json:"nodes"`
	Edges []GraphEdge `json:"edges"`
}

// GraphNode is one operator.
type GraphNode struct {
	UID  string `json:"uid"`
	Kind string `json:"kind"`
	// Parallelism is the number of tasks running the operator (source
	// splits, keyed subtasks; 1 for sinks); 0 for operators chained into
	// their input's tasks.
	Parallelism int `json:"parallelism"`
}

// GraphEdge is a stream between two operators. Kind is "forward" (chained
// in one task), "keyed" (a shuffle by key), "rebalance" (dealt over the
// subtasks of a parallel stage), "side-output", or "dead-letter" (records
// an operator rejects).
type GraphEdge struct {
	From string `json:"from"`
	To   string `json:"to"`
	Kind string `json:"kind"`
}

// DeadLetterStatus is one recently rejected record.
type DeadLetterStatus struct {
	Time     time.Time `json:"time"`
	Operator string    `json:"operator"`
	// Policy is "dead-letter" or "skip".
	Policy string `json:"policy"`
	// Reason is the class of failure: "decode" (a source record could not
	// be decoded), "validate" (a decoded record failed validation),
	// "process" (a user function failed on it), "panic" (a user function
	// panicked) or "late" (it arrived behind the operator's watermark).
	Reason string `json:"reason"`
	// Error is the failure's message (truncated to 512 bytes).
	Error string `json:"error"`
}

// SplitLag is one split's lag (-1: unknown) and watermark as last
// published by its task.
type SplitLag struct {
	Source string `json:"source"`
	Split  string `json:"split"`
	Lag    int64  `json:"lag"`
	// Watermark is the split's event-time watermark (nil: none yet).
	Watermark *time.Time `json:"watermark,omitempty"`
	// Idle is set while the split is idle (see SplitStats.Idle).
	Idle bool `json:"idle"`
}

// StatusDocument is the JSON document of GET /status: the Status plus the
// job graph, each split's lag and the recent dead letters (newest first).
type StatusDocument struct {
	Status
	Graph       *Graph             `json:"graph,omitempty"`
	Lag         []SplitLag         `json:"lag"`
	DeadLetters []DeadLetterStatus `json:"deadLetters"`
	// SampleInterval is the period of the history samples, in milliseconds.
	SampleInterval int64 `json:"sampleIntervalMs"`
}

// StatusSample is one sample of the history: split lag by "source/split"
// (splits with unknown lag are left out) and each operator's cumulative
// record counters, by UID.
type StatusSample struct {
	Time int64            `json:"t"` // Unix milliseconds
	Lag  map[string]int64 `json:"lag"`
	In   map[string]int64 `json:"in"`
	Out  map[string]int64 `json:"out"`
}

// StatusHistory is the JSON document of GET /status/history: the samples,
// oldest first.
type StatusHistory struct {
	IntervalMs int64          `json:"intervalMs"`
	Samples    []StatusSample `json:"samples"`
}

// statusPage is the Engine's state for the status page. Its fields are
// guarded by mu; the ring is written by the sampler goroutine only.
type statusPage struct {
	mu struct {
		sync.Mutex
		graph   *Graph
		dead    []DeadLetterStatus // ring of StatusDeadLetters, oldest at deadAt
		deadAt  int
		samples []StatusSample // ring of StatusSamples, oldest at sampleAt
		at      int
	}
}

// SetGraph records the job's operator graph for the status endpoint. The
// Engine keeps its own copy. Safe for concurrent use.
func (e *Engine) SetGraph(g Graph) {
	c := &Graph{Nodes: append([]GraphNode(nil), g.Nodes...), Edges: append([]GraphEdge(nil), g.Edges...)}
	e.page.mu.Lock()
	e.page.mu.graph = c
	e.page.mu.Unlock()
}

// RecordDeadLetter keeps d among the recent dead letters the status endpoint
// shows (the last StatusDeadLetters). It takes a lock: call it for rejected
// records only, never per record. Safe for concurrent use.
func (e *Engine) RecordDeadLetter(d DeadLetterStatus) {
	if len(d.Error) > maxDeadLetterError {
		d.Error = strings.ToValidUTF8(d.Error[:maxDeadLetterError], "") + "…"
	}
	p := &e.page
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.mu.dead) < StatusDeadLetters {
		p.mu.dead = append(p.mu.dead, d)
		return
	}
	p.mu.dead[p.mu.deadAt] = d
	p.mu.deadAt = (p.mu.deadAt + 1) % StatusDeadLetters
}

// statusDocument returns the document GET /status serves.
func (e *Engine) statusDocument() StatusDocument {
	doc := StatusDocument{Status: e.Status(), Lag: e.splitLags(), SampleInterval: StatusSampleInterval.Milliseconds()}
	p := &e.page
	p.mu.Lock()
	doc.Graph = p.mu.graph
	n := len(p.mu.dead)
	doc.DeadLetters = make([]DeadLetterStatus, 0, n)
	for i := n - 1; i >= 0; i-- { // newest first
		doc.DeadLetters = append(doc.DeadLetters, p.mu.dead[(p.mu.deadAt+i)%n])
	}
	p.mu.Unlock()
	return doc
}

// statusHistory returns the sampled history, oldest first.
func (e *Engine) statusHistory() StatusHistory {
	p := &e.page
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.mu.samples)
	h := StatusHistory{IntervalMs: StatusSampleInterval.Milliseconds(), Samples: make([]StatusSample, 0, n)}
	for i := range n {
		h.Samples = append(h.Samples, p.mu.samples[(p.mu.at+i)%n])
	}
	return h
}

// sample takes one sample of lag and counters into the ring.
func (e *Engine) sample(now time.Time) {
	s := StatusSample{Time: now.UnixMilli(), Lag: map[string]int64{}, In: map[string]int64{}, Out: map[string]int64{}}
	for _, sp := range e.splitStats() {
		if l := sp.Lag.Load(); l >= 0 {
			s.Lag[sp.Source+"/"+sp.Split] = l
		}
	}
	e.mu.Lock()
	for _, o := range e.mu.operators {
		s.In[o.UID], s.Out[o.UID] = o.In.Load(), o.Out.Load()
	}
	e.mu.Unlock()
	p := &e.page
	p.mu.Lock()
	if len(p.mu.samples) < StatusSamples {
		p.mu.samples = append(p.mu.samples, s)
	} else {
		p.mu.samples[p.mu.at] = s
		p.mu.at = (p.mu.at + 1) % StatusSamples
	}
	p.mu.Unlock()
}

// runSampler samples every StatusSampleInterval until quit is closed; the
// first sample is taken at once. Run starts it (joined by Run's WaitGroup)
// when the status endpoint is enabled.
func (e *Engine) runSampler(quit <-chan struct{}) {
	e.sample(time.Now())
	t := time.NewTicker(StatusSampleInterval)
	defer t.Stop()
	for {
		select {
		case <-quit:
			e.sample(time.Now()) // the final counters
			return
		case now := <-t.C:
			e.sample(now)
		}
	}
}

// registerStatusRoutes adds the status endpoint's routes to mux.
func (e *Engine) registerStatusRoutes(mux *http.ServeMux) {
	var pageHandler http.Handler
	if ui, err := fs.Sub(webFS, "web"); err == nil {
		pageHandler = http.StripPrefix("/ui/", http.FileServerFS(ui))
	} else { // cannot happen with the embedded directory; answer rather than panic
		pageHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "status page not embedded: "+err.Error(), http.StatusInternalServerError)
		})
	}
	writeJSON := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v) // a failed write means the client went away
	}
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, e.statusDocument()) })
	mux.HandleFunc("GET /status/history", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, e.statusHistory()) })
	mux.Handle("GET /ui/", pageHandler)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept"), "text/html") {
			http.Redirect(w, r, "/ui/", http.StatusFound)
			return
		}
		writeJSON(w, e.statusDocument())
	})
}
