package runtime

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestStatusWatermarks checks the watermarks and holders Status derives
// from the tasks' gauges and the job graph: a source of three splits (one
// with a watermark, one without any record yet, one idle), a map chained
// after it, a keyed operator with two subtasks, its sink, and a dead-letter
// sink that must not inherit anything through its dead-letter edge.
func TestStatusWatermarks(t *testing.T) {
	e, err := New(Config{Name: "wm"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.SetGraph(Graph{
		Nodes: []GraphNode{{UID: "src", Kind: "source"}, {UID: "parse", Kind: "map"}, {UID: "win", Kind: "keyed-process"},
			{UID: "out", Kind: "sink"}, {UID: "dlq", Kind: "sink"}},
		Edges: []GraphEdge{{From: "src", To: "parse", Kind: "forward"}, {From: "parse", To: "win", Kind: "keyed"},
			{From: "win", To: "out", Kind: "forward"}, {From: "parse", To: "dlq", Kind: "dead-letter"}},
	})
	for _, n := range []struct{ uid, kind string }{{"src", "source"}, {"parse", "map"}, {"win", "keyed-process"}, {"out", "sink"}, {"dlq", "sink"}} {
		e.Operator(n.uid, n.kind)
	}
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	q0, q1, q2 := e.Split("src", "q0"), e.Split("src", "q1"), e.Split("src", "q2")
	q0.Watermark.Store(t0.UnixNano())
	q2.Watermark.Store(t0.Add(-time.Hour).UnixNano())
	q2.Idle.Store(true)
	win := e.Operator("win", "keyed-process")
	win.Watermark(0).Store(t0.Add(-time.Minute).UnixNano())
	win.Watermark(1) // registered, no watermark yet

	ops := func() map[string]OperatorStatus {
		m := map[string]OperatorStatus{}
		for _, o := range e.Status().Operators {
			m[o.UID] = o
		}
		return m
	}
	wmIs := func(o OperatorStatus, want time.Time) {
		t.Helper()
		switch {
		case want.IsZero() && o.Watermark != nil:
			t.Errorf("%s: watermark %v, want none", o.UID, *o.Watermark)
		case !want.IsZero() && (o.Watermark == nil || !o.Watermark.Equal(want)):
			t.Errorf("%s: watermark %v, want %v", o.UID, o.Watermark, want)
		}
	}
	holders := func(o OperatorStatus) []string {
		var s []string
		for _, h := range o.HeldBy {
			s = append(s, h.Source+"/"+h.Split)
		}
		return s
	}

	// q1 has no watermark and is not idle: it holds everything back.
	m := ops()
	for _, uid := range []string{"src", "parse", "win", "out"} {
		wmIs(m[uid], time.Time{})
		if got := holders(m[uid]); !slices.Equal(got, []string{"src/q1"}) {
			t.Errorf("%s held by %v, want [src/q1]", uid, got)
		}
	}
	if m["dlq"].Watermark != nil || m["dlq"].HeldBy != nil {
		t.Errorf("dead-letter sink: %+v", m["dlq"])
	}

	// q1 catches up past q0: q0 holds the source back; the keyed
	// operator reports its own subtasks' lowest.
	q1.Watermark.Store(t0.Add(time.Minute).UnixNano())
	win.Watermark(1).Store(t0.UnixNano())
	m = ops()
	wmIs(m["src"], t0)
	wmIs(m["parse"], t0)
	wmIs(m["win"], t0.Add(-time.Minute))
	wmIs(m["out"], t0.Add(-time.Minute))
	if got := holders(m["win"]); !slices.Equal(got, []string{"src/q0"}) {
		t.Errorf("win held by %v, want [src/q0]", got)
	}
	if h := m["win"].HeldBy; len(h) != 1 || h[0].Idle || h[0].Watermark == nil || !h[0].Watermark.Equal(t0) {
		t.Errorf("holder %+v", h)
	}

	// Every split idle: the source's watermark is the highest; nothing holds.
	q0.Idle.Store(true)
	q1.Idle.Store(true)
	m = ops()
	wmIs(m["src"], t0.Add(time.Minute))
	if m["win"].HeldBy != nil {
		t.Errorf("all idle, win held by %v", holders(m["win"]))
	}
	// Ended splits hold nothing back either.
	q0.Idle.Store(false)
	q0.Watermark.Store(math.MaxInt64)
	if m = ops(); m["win"].HeldBy != nil {
		t.Errorf("ended split holds: %v", holders(m["win"]))
	}
}

// TestStatusOffsetDescriptions: checkpointed offsets are shown decoded,
// by the source's describer when it registered one.
func TestStatusOffsetDescriptions(t *testing.T) {
	e, err := New(Config{Name: "offsets"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.DescribeOffsets("mq", func(b []byte) string { return "next " + string(b) })
	e.mu.Lock()
	e.mu.committed["mq\x00q0"] = []byte("405")
	e.mu.committed["gen\x000"] = []byte{0, 0, 0, 0, 0, 0, 0, 9}
	e.mu.committed["other\x000"] = []byte{1, 2}
	e.mu.Unlock()
	got := map[string]string{}
	for _, s := range e.Status().Splits {
		got[s.Source] = s.Offset
	}
	want := map[string]string{"mq": "next 405", "gen": "position 9", "other": "hex 0102"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: offset %q, want %q", k, got[k], v)
		}
	}
}
