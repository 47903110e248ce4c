package pipeline

import (
	"errors"

	"github.com/runnel-dev/runnel/runtime"
)

// recordDeadLetter shows a rejected record among the status page's recent
// dead letters (called for rejected records only: it takes a lock).
func recordDeadLetter(e *runtime.Engine, operator, policy string, fromSource bool, err error) {
	reason := "error"
	switch {
	case fromSource:
		reason = "decode"
	case errors.Is(err, ErrPanic):
		reason = "panic"
	}
	e.RecordDeadLetter(runtime.DeadLetterStatus{Time: e.Now(), Operator: operator, Policy: policy, Reason: reason, Error: err.Error()})
}

// statusGraph returns the job's operator graph for the status endpoint:
// every operator with its task count, and every stream between operators
// (chained, keyed shuffles, side outputs, dead-letter policies). Call it
// after plan, when source split counts are known.
func (r *jobRun) statusGraph() runtime.Graph {
	var g runtime.Graph
	tasks := make(map[*node]int)
	for _, t := range r.tasks {
		tasks[t.node]++
	}
	seen := make(map[[2]string]bool)
	edge := func(from, to *node, kind string) {
		if from == nil || to == nil || seen[[2]string{from.uid, to.uid}] {
			return
		}
		seen[[2]string{from.uid, to.uid}] = true
		g.Edges = append(g.Edges, runtime.GraphEdge{From: from.uid, To: to.uid, Kind: kind})
	}
	for _, n := range r.job.nodes {
		g.Nodes = append(g.Nodes, runtime.GraphNode{UID: n.uid, Kind: n.kind, Parallelism: tasks[n]})
		for _, out := range n.outs {
			kind := "forward"
			switch out.kind {
			case kindProcess, kindReduce, kindAggregate:
				kind = "keyed"
			}
			edge(n, out, kind)
		}
		for _, side := range n.sides {
			edge(n, side, "side-output")
		}
		edge(n, r.job.dlqNode(n.policy), "dead-letter")
	}
	return g
}
