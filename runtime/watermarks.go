package runtime

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Watermarks and offsets on the status endpoint: every operator's
// event-time watermark and the source splits that hold it back, and
// checkpointed offsets decoded for people.
//
// Tasks publish gauges, read without locks: a source task stores its
// split's watermark and idleness into the split's SplitStats, a keyed
// subtask its watermark into OperatorStats.Watermark(subtask). Status
// derives the rest from them and the job graph (SetGraph): a source's
// watermark from its splits, a chained operator's or a sink's from its
// inputs, and for every operator the active splits upstream with the
// lowest watermark.

// NoWatermark is the value of a watermark gauge that has no watermark yet.
const NoWatermark = math.MinInt64

// Watermark returns the gauge of keyed subtask's event-time watermark (Unix
// nanoseconds, NoWatermark while it has none), registering it on first use.
// The subtask's task stores into it when its watermark advances; the
// status endpoint reports the lowest over the subtasks. Safe for
// concurrent use.
func (o *OperatorStats) Watermark(subtask int) *atomic.Int64 {
	o.wm.Lock()
	defer o.wm.Unlock()
	for len(o.wm.subtasks) <= subtask {
		g := new(atomic.Int64)
		g.Store(NoWatermark)
		o.wm.subtasks = append(o.wm.subtasks, g)
	}
	return o.wm.subtasks[subtask]
}

// subtaskWatermark returns the lowest watermark of the operator's
// subtasks; ok is false when none registered a gauge.
func (o *OperatorStats) subtaskWatermark() (wm int64, ok bool) {
	o.wm.Lock()
	defer o.wm.Unlock()
	if len(o.wm.subtasks) == 0 {
		return 0, false
	}
	wm = math.MaxInt64
	for _, g := range o.wm.subtasks {
		wm = min(wm, g.Load())
	}
	return wm, true
}

// DescribeOffsets registers how the status endpoint shows the checkpointed
// offsets of source (a source UID): fn turns one split's encoded offset
// into text such as "next 405". fn must be fast and safe for concurrent
// use; it is called with the engine's lock held. Without one, 8-byte
// offsets show as "position N" and others as "hex …". Safe for concurrent
// use.
func (e *Engine) DescribeOffsets(source string, fn func(offset []byte) string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.describe == nil {
		e.mu.describe = make(map[string]func([]byte) string)
	}
	e.mu.describe[source] = fn
}

// describeOffsetLocked describes one checkpointed offset of source.
func (e *Engine) describeOffsetLocked(source string, b []byte) string {
	if fn := e.mu.describe[source]; fn != nil {
		if s := fn(b); s != "" {
			return s
		}
	}
	return DescribeOffset(b)
}

// DescribeOffset is the description of an offset whose source registered
// none: "position N" for an 8-byte big-endian counter (the slice and
// generator sources), else "hex …".
func DescribeOffset(b []byte) string {
	if len(b) == 8 {
		return fmt.Sprintf("position %d", binary.BigEndian.Uint64(b))
	}
	return "hex " + hex.EncodeToString(b)
}

// graph returns the job graph set by SetGraph (nil before). The returned
// graph is never modified.
func (e *Engine) graph() *Graph {
	e.page.mu.Lock()
	defer e.page.mu.Unlock()
	return e.page.mu.graph
}

func wmTime(ns int64) *time.Time {
	if ns == NoWatermark {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

// addWatermarksLocked fills the operators' Watermark and HeldBy from the
// gauges (splits, the operators' subtasks) and the job graph (nil: only
// the keyed operators' own watermarks are known).
func (e *Engine) addWatermarksLocked(st *Status, splits []*SplitStats, g *Graph) {
	bySource := make(map[string][]*SplitStats)
	for _, s := range splits {
		bySource[s.Source] = append(bySource[s.Source], s)
	}
	stats := make(map[string]*OperatorStats, len(e.mu.operators))
	for _, o := range e.mu.operators {
		stats[o.UID] = o
	}
	inputs := make(map[string][]string) // data edges only: not dead letters
	kinds := make(map[string]string)
	if g != nil {
		for _, n := range g.Nodes {
			kinds[n.UID] = n.Kind
		}
		for _, ed := range g.Edges {
			if ed.Kind != "dead-letter" {
				inputs[ed.To] = append(inputs[ed.To], ed.From)
			}
		}
	}
	// wmOf computes an operator's watermark (ok false: none), memoised;
	// the graph is acyclic, and visiting guards against a malformed one.
	memo := make(map[string]int64)
	visiting := make(map[string]bool)
	var wmOf func(uid string) int64
	wmOf = func(uid string) int64 {
		if wm, ok := memo[uid]; ok {
			return wm
		}
		if visiting[uid] {
			return NoWatermark
		}
		visiting[uid] = true
		defer delete(visiting, uid)
		wm := int64(NoWatermark)
		if o := stats[uid]; o != nil {
			if sub, ok := o.subtaskWatermark(); ok {
				memo[uid] = sub
				return sub
			}
		}
		switch {
		case kinds[uid] == "source" || (g == nil && len(bySource[uid]) > 0):
			wm = sourceWatermark(bySource[uid])
		case len(inputs[uid]) > 0:
			wm = math.MaxInt64
			for _, in := range inputs[uid] {
				wm = min(wm, wmOf(in))
			}
		}
		memo[uid] = wm
		return wm
	}
	for i := range st.Operators {
		op := &st.Operators[i]
		op.Watermark = wmTime(wmOf(op.UID))
		if g != nil {
			op.HeldBy = heldBy(upstreamSplits(op.UID, kinds, inputs, bySource))
		}
	}
}

// sourceWatermark is a source's watermark from its splits': the lowest of
// the active ones, the highest when all are idle (as the keyed subtasks
// downstream combine them).
func sourceWatermark(splits []*SplitStats) int64 {
	lowest, highest, active := int64(math.MaxInt64), int64(NoWatermark), false
	for _, s := range splits {
		wm := s.Watermark.Load()
		highest = max(highest, wm)
		if s.Idle.Load() {
			continue
		}
		active = true
		lowest = min(lowest, wm)
	}
	switch {
	case len(splits) == 0:
		return NoWatermark
	case !active:
		return highest
	}
	return lowest
}

// upstreamSplits returns the splits of the sources operator uid reads
// from, through the graph's data edges.
func upstreamSplits(uid string, kinds map[string]string, inputs map[string][]string, bySource map[string][]*SplitStats) []*SplitStats {
	var out []*SplitStats
	seen := map[string]bool{}
	var walk func(string)
	walk = func(u string) {
		if seen[u] {
			return
		}
		seen[u] = true
		if kinds[u] == "source" {
			out = append(out, bySource[u]...)
		}
		for _, in := range inputs[u] {
			walk(in)
		}
	}
	walk(uid)
	return out
}

// heldBy returns the active splits with the lowest watermark (splits whose
// input ended, at math.MaxInt64, hold nothing back).
func heldBy(splits []*SplitStats) []SplitWatermark {
	lowest := int64(math.MaxInt64)
	for _, s := range splits {
		if !s.Idle.Load() {
			lowest = min(lowest, s.Watermark.Load())
		}
	}
	if lowest == math.MaxInt64 {
		return nil
	}
	var out []SplitWatermark
	for _, s := range splits {
		if wm := s.Watermark.Load(); !s.Idle.Load() && wm == lowest {
			out = append(out, SplitWatermark{Source: s.Source, Split: s.Split, Watermark: wmTime(wm)})
		}
	}
	return out
}
