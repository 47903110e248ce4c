package pipeline

import (
	"github.com/runnel-dev/runnel/runtime"
)

// recordDeadLetter shows a rejected record among the status page's recent
// dead letters (called for rejected records only: it takes a lock).
func recordDeadLetter(e *runtime.Engine, operator, policy, reason string, err error) {
	e.RecordDeadLetter(runtime.DeadLetterStatus{Time: e.Now(), Operator: operator, Policy: policy, Reason: reason, Error: err.Error()})
}

// offsetDescriber is implemented by sources that describe their encoded
// offsets for people (source/rocketmq: "next 405").
type offsetDescriber interface {
	DescribeOffset(offset []byte) string
}

// publishStatus gives the engine what its status endpoint shows beyond
// the tasks' counters: the job graph, and how each source's checkpointed
// offsets read.
func (r *jobRun) publishStatus() {
	r.engine.SetGraph(r.statusGraph())
	for _, n := range r.job.nodes {
		if d, ok := n.src.(offsetDescriber); ok && n.kind == kindSource {
			r.engine.DescribeOffsets(n.uid, d.DescribeOffset)
		}
	}
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
			case kindRebalance, kindAsync, kindOpProcess: // rebalance.go
				kind = "rebalance"
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
