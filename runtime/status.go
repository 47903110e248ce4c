package runtime

import (
	"encoding/hex"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// OperatorStats counts one operator's records. The counters are updated by
// the operator's tasks (atomically, usually once per batch) and read by the
// status endpoint.
type OperatorStats struct {
	UID  string
	Kind string
	// In and Out count records received and emitted.
	In, Out atomic.Int64
	// Errors counts records rejected by the operator (dead-lettered or
	// skipped).
	Errors atomic.Int64
}

// Operator registers (or returns the registered) stats of an operator.
func (e *Engine) Operator(uid, kind string) *OperatorStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, o := range e.mu.operators {
		if o.UID == uid {
			return o
		}
	}
	o := &OperatorStats{UID: uid, Kind: kind}
	e.mu.operators = append(e.mu.operators, o)
	return o
}

// CheckpointStatus is one checkpoint's outcome as shown by the status
// endpoint.
type CheckpointStatus struct {
	ID           uint64        `json:"id"`
	Time         time.Time     `json:"time"`
	Duration     time.Duration `json:"durationNs"`
	Bytes        int64         `json:"bytes"`
	StateChanges int           `json:"stateChanges"`
	Result       string        `json:"result"`
}

// Status is the JSON document served by the status endpoint.
type Status struct {
	Job         string             `json:"job"`
	State       string             `json:"state"`
	Operators   []OperatorStatus   `json:"operators"`
	Splits      []SplitStatus      `json:"splits"`
	Checkpoints []CheckpointStatus `json:"checkpoints"`
}

// OperatorStatus is one operator's counters.
type OperatorStatus struct {
	UID    string `json:"uid"`
	Kind   string `json:"kind"`
	In     int64  `json:"recordsIn"`
	Out    int64  `json:"recordsOut"`
	Errors int64  `json:"recordsRejected"`
}

// SplitStatus is one split's committed offset (hex of the source's opaque
// encoding).
type SplitStatus struct {
	Source          string `json:"source"`
	Split           string `json:"split"`
	CommittedOffset string `json:"committedOffset"`
}

// Status returns a snapshot of the job's status.
func (e *Engine) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{Job: e.cfg.Name, State: e.mu.state}
	for _, o := range e.mu.operators {
		st.Operators = append(st.Operators, OperatorStatus{UID: o.UID, Kind: o.Kind, In: o.In.Load(), Out: o.Out.Load(), Errors: o.Errors.Load()})
	}
	for k, v := range e.mu.committed {
		src, split, _ := strings.Cut(k, "\x00")
		st.Splits = append(st.Splits, SplitStatus{Source: src, Split: split, CommittedOffset: hex.EncodeToString(v)})
	}
	sort.Slice(st.Splits, func(i, j int) bool {
		if st.Splits[i].Source != st.Splits[j].Source {
			return st.Splits[i].Source < st.Splits[j].Source
		}
		return st.Splits[i].Split < st.Splits[j].Split
	})
	for i := len(e.mu.history) - 1; i >= 0; i-- {
		st.Checkpoints = append(st.Checkpoints, e.mu.history[i])
	}
	return st
}

func (e *Engine) statusHandler() http.Handler {
	mux := http.NewServeMux()
	e.registerStatusRoutes(mux) // statuspage.go: /, /status, /status/history, /ui/
	return mux
}
