package runtime

import (
	"encoding/hex"
	"net/http"
	"sort"
	"strings"
	"sync"
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
	// Late counts records that arrived behind the operator's watermark,
	// after every window (or timer) they belonged to had expired: dropped,
	// dead-lettered or sent to a side output (window operators).
	Late atomic.Int64

	// wm holds the gauges of the operator's keyed subtasks' watermarks
	// (watermarks.go).
	wm struct {
		sync.Mutex
		subtasks []*atomic.Int64
	}
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

// OperatorStatus is one operator's counters and event-time watermark.
type OperatorStatus struct {
	UID    string `json:"uid"`
	Kind   string `json:"kind"`
	In     int64  `json:"recordsIn"`
	Out    int64  `json:"recordsOut"`
	Errors int64  `json:"recordsRejected"`
	// Late counts the records that arrived behind the operator's
	// watermark (see OperatorStats.Late).
	Late int64 `json:"recordsLate"`
	// Watermark is the operator's event-time watermark: the lowest of its
	// keyed subtasks' watermarks; for a source, the lowest of its active
	// splits' (the highest when every split is idle); for the operators
	// chained after them and for sinks, the lowest of their inputs'. Nil
	// while it has none (no record with an event time reached it yet, or
	// a split without a watermark holds it back).
	Watermark *time.Time `json:"watermark,omitempty"`
	// HeldBy lists the source splits holding the watermark back: among
	// the active (not idle) splits upstream of the operator, those with
	// the lowest watermark (splits without one first). A split that never
	// receives records (an empty queue) holds every watermark downstream
	// back until pipeline.IdleTimeout marks it idle. Empty when every
	// split upstream is idle or the job graph is unknown.
	HeldBy []SplitWatermark `json:"heldBy,omitempty"`
}

// SplitWatermark is one source split's event-time watermark.
type SplitWatermark struct {
	Source string `json:"source"`
	Split  string `json:"split"`
	// Watermark is the split's last watermark (nil: none yet).
	Watermark *time.Time `json:"watermark,omitempty"`
	// Idle is set while the split is idle (pipeline.IdleTimeout): it does
	// not hold watermarks back.
	Idle bool `json:"idle"`
}

// SplitStatus is one split's committed offset.
type SplitStatus struct {
	Source string `json:"source"`
	Split  string `json:"split"`
	// CommittedOffset is the hex of the source's opaque encoding.
	CommittedOffset string `json:"committedOffset"`
	// Offset is the same offset decoded for people, as runnel checkpoint
	// inspect shows it: "next 405" (the next queue offset to read) for
	// RocketMQ splits, the source's own description when it registered
	// one (Engine.DescribeOffsets), "position N" for an 8-byte counter,
	// else "hex …".
	Offset string `json:"offset"`
}

// Status returns a snapshot of the job's status.
func (e *Engine) Status() Status {
	splits, graph := e.splitStats(), e.graph()
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{Job: e.cfg.Name, State: e.mu.state}
	for _, o := range e.mu.operators {
		st.Operators = append(st.Operators, OperatorStatus{UID: o.UID, Kind: o.Kind, In: o.In.Load(), Out: o.Out.Load(),
			Errors: o.Errors.Load(), Late: o.Late.Load()})
	}
	for k, v := range e.mu.committed {
		src, split, _ := strings.Cut(k, "\x00")
		st.Splits = append(st.Splits, SplitStatus{Source: src, Split: split, CommittedOffset: hex.EncodeToString(v),
			Offset: e.describeOffsetLocked(src, v)})
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
	e.addWatermarksLocked(&st, splits, graph) // watermarks.go
	return st
}

func (e *Engine) statusHandler() http.Handler {
	mux := http.NewServeMux()
	e.registerStatusRoutes(mux)    // statuspage.go: /, /status, /status/history, /ui/
	e.registerSavepointRoutes(mux) // savepoint.go: POST /savepoint
	return mux
}
