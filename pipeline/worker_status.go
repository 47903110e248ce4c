package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// WorkerStatus is what a worker of a job run with RunWorker serves at
// /status (JSON) and / (a page) on its StatusAddress.
type WorkerStatus struct {
	Job      string             `json:"job"`
	Worker   string             `json:"worker"`
	Group    string             `json:"group"`
	Tasks    []WorkerTask       `json:"tasks"`
	Standbys []WorkerStandby    `json:"standbys"`
	Handoffs []WorkerHandoff    `json:"handoffs"`
	Chains   []WorkerChainState `json:"chains"`
}

// WorkerTask is a task the worker owns.
type WorkerTask struct {
	Task       string         `json:"task"`
	State      string         `json:"state"` // waiting-lock, claiming, restoring, running, failed
	OwnerEpoch uint64         `json:"ownerEpoch"`
	Locked     bool           `json:"locked"`
	Since      time.Time      `json:"since"`
	Restore    *RestoreStatus `json:"restore,omitempty"`
	LastError  string         `json:"lastError,omitempty"`
	Job        runtime.Status `json:"job"`
}

// RestoreStatus says how a task's state was brought to its checkpoint when
// the worker took it.
type RestoreStatus struct {
	Checkpoint   uint64        `json:"checkpoint"`
	Reused       bool          `json:"reused"`
	FromSnapshot bool          `json:"fromSnapshot"`
	Segments     int           `json:"segments"`
	Bytes        int64         `json:"bytes"`
	Duration     time.Duration `json:"durationNs"`
}

// WorkerStandby is a warm copy the worker keeps of a task it does not own.
type WorkerStandby struct {
	Task   string `json:"task"`
	At     uint64 `json:"checkpoint"`
	Latest uint64 `json:"latestPublished"`
	Lag    uint64 `json:"lagCheckpoints"`
}

// WorkerHandoff is one change of a task's ownership seen by this worker.
type WorkerHandoff struct {
	Time   time.Time `json:"time"`
	Task   string    `json:"task"`
	Event  string    `json:"event"` // assigned, claimed, revoked, fenced, failed
	Detail string    `json:"detail,omitempty"`
}

// WorkerChainState is every task's latest published checkpoint as this
// worker's follower reads the commit chains: who owns what, job-wide.
type WorkerChainState struct {
	Task       string    `json:"task"`
	Owner      string    `json:"owner"`
	OwnerEpoch uint64    `json:"ownerEpoch"`
	Checkpoint uint64    `json:"checkpoint"`
	Time       time.Time `json:"time"`
	Snapshot   uint64    `json:"snapshot"`
	Segments   int       `json:"segmentsSinceSnapshot"`
}

// maxHandoffs bounds the hand-off history kept for the status.
const maxHandoffs = 200

// taskState records a task's state for the status.
func (tr *taskRun) setState(s string) {
	tr.statusMu.Lock()
	tr.state = s
	tr.statusMu.Unlock()
}

func (w *worker) handoff(task, event, detail string) {
	w.statusMu.Lock()
	defer w.statusMu.Unlock()
	w.handoffs = append(w.handoffs, WorkerHandoff{Time: time.Now(), Task: task, Event: event, Detail: detail})
	if len(w.handoffs) > maxHandoffs {
		w.handoffs = append(w.handoffs[:0], w.handoffs[len(w.handoffs)-maxHandoffs:]...)
	}
}

// Status returns the worker's status.
func (w *worker) status() WorkerStatus {
	st := WorkerStatus{Job: w.name, Worker: w.c.ClientID(), Group: w.group}
	w.mu.Lock()
	trs := make([]*taskRun, 0, len(w.mu.tasks))
	for _, tr := range w.mu.tasks {
		trs = append(trs, tr)
	}
	sbs := make([]protocol.MessageQueue, 0, len(w.mu.standbys))
	for q := range w.mu.standbys {
		sbs = append(sbs, q)
	}
	w.mu.Unlock()
	for _, tr := range trs {
		tr.statusMu.Lock()
		t := WorkerTask{Task: tr.id.String(), State: tr.state, OwnerEpoch: tr.owner, Since: tr.since, Restore: tr.restore, LastError: tr.lastErr}
		j := tr.job
		tr.statusMu.Unlock()
		tr.lockMu.Lock()
		t.Locked = !tr.lockedUntil.IsZero()
		tr.lockMu.Unlock()
		if j != nil {
			t.Job = j.Status()
		}
		st.Tasks = append(st.Tasks, t)
	}
	slices.SortFunc(st.Tasks, func(a, b WorkerTask) int { return strings.Compare(a.Task, b.Task) })
	for _, q := range sbs {
		s := w.byIn[q.Topic]
		if s == nil {
			continue
		}
		id := taskOf(s, q).String()
		sb := WorkerStandby{Task: id}
		w.statusMu.Lock()
		sb.At = w.standbyAt[id]
		w.statusMu.Unlock()
		if v, err := w.follower.View(id); err == nil && v.Latest != nil {
			sb.Latest = v.Latest.Seq
			if sb.Latest > sb.At {
				sb.Lag = sb.Latest - sb.At
			}
		}
		st.Standbys = append(st.Standbys, sb)
	}
	slices.SortFunc(st.Standbys, func(a, b WorkerStandby) int { return strings.Compare(a.Task, b.Task) })
	w.statusMu.Lock()
	st.Handoffs = slices.Clone(w.handoffs)
	w.statusMu.Unlock()
	for _, s := range w.stageList() {
		for _, q := range w.layoutOf(s).Queues(s.input) {
			id := taskOf(s, q).String()
			cs := WorkerChainState{Task: id}
			if v, err := w.follower.View(id); err == nil && v.Latest != nil {
				cs.Owner, cs.OwnerEpoch, cs.Checkpoint = v.Latest.Worker, v.Latest.OwnerEpoch, v.Latest.Seq
				cs.Time, cs.Snapshot, cs.Segments = time.UnixMilli(v.Latest.TimeMs), v.Latest.Snapshot.Seq, len(v.Latest.Segments)
			}
			st.Chains = append(st.Chains, cs)
		}
	}
	return st
}

// stageList returns the stages sorted by head UID.
func (w *worker) stageList() []*stageInfo {
	out := make([]*stageInfo, 0, len(w.stages))
	for _, s := range w.stages {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *stageInfo) int { return strings.Compare(a.head, b.head) })
	return out
}

// serveStatus serves the worker's status on addr until ctx ends.
func (w *worker) serveStatus(ctx context.Context, addr string, onListen func(string)) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pipeline: worker status endpoint: %w", err)
	}
	if onListen != nil {
		onListen(ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(w.status())
	})
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(rw, r)
			return
		}
		rw.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := workerPage.Execute(rw, w.status()); err != nil {
			w.log.Warn("worker status page", "err", err)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.log.Warn("worker status endpoint stopped", "err", err)
		}
	}()
	return func() { _ = srv.Close(); <-done }, nil
}

var workerPage = template.Must(template.New("worker").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{.Job}} — worker {{.Worker}}</title>
<style>body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f4f4f4}</style></head><body>
<h1>{{.Job}}</h1><p>worker <b>{{.Worker}}</b>, group {{.Group}} · <a href="/status">/status</a></p>
<h2>Tasks owned here</h2><table><tr><th>task</th><th>state</th><th>owner epoch</th><th>lock</th><th>since</th><th>restore</th><th>error</th></tr>
{{range .Tasks}}<tr><td>{{.Task}}</td><td>{{.State}}</td><td>{{.OwnerEpoch}}</td><td>{{if .Locked}}held{{else}}–{{end}}</td>
<td>{{.Since.Format "15:04:05"}}</td><td>{{with .Restore}}{{if .Reused}}local{{else if .FromSnapshot}}snapshot{{else}}changelog{{end}} +{{.Segments}} ({{.Bytes}} B, {{.Duration}}){{end}}</td><td>{{.LastError}}</td></tr>{{end}}</table>
<h2>Standbys</h2><table><tr><th>task</th><th>at checkpoint</th><th>latest published</th><th>lag</th></tr>
{{range .Standbys}}<tr><td>{{.Task}}</td><td>{{.At}}</td><td>{{.Latest}}</td><td>{{.Lag}}</td></tr>{{end}}</table>
<h2>All tasks (commit chains)</h2><table><tr><th>task</th><th>owner</th><th>owner epoch</th><th>checkpoint</th><th>at</th><th>snapshot</th></tr>
{{range .Chains}}<tr><td>{{.Task}}</td><td>{{.Owner}}</td><td>{{.OwnerEpoch}}</td><td>{{.Checkpoint}}</td><td>{{if .Checkpoint}}{{.Time.Format "15:04:05"}}{{end}}</td><td>{{.Snapshot}}</td></tr>{{end}}</table>
<h2>Hand-offs</h2><table><tr><th>time</th><th>task</th><th>event</th><th>detail</th></tr>
{{range .Handoffs}}<tr><td>{{.Time.Format "15:04:05.000"}}</td><td>{{.Task}}</td><td>{{.Event}}</td><td>{{.Detail}}</td></tr>{{end}}</table>
</body></html>`))
