package pipeline

import (
	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Scale-out runs each task of a job as a run of its own (RunWorker builds
// a fresh Job per task): a taskScope restricts such a run to the task's
// part of the graph.
//
// A job is cut into stages at its keyed operators. Every source is a stage
// head, and so is every keyed operator not declared PrePartitioned (one
// that is belongs to its input's stage). A task of a source stage reads one
// split (queue) of its source; a task of a keyed stage reads one range of
// key groups from the stage's repartition topic. In a task's run, the nodes
// reachable from its head without entering another stage run as usual
// (chained operators, PrePartitioned keyed operators with one subtask over
// every key group, sinks and dead-letter sinks with one task each); a keyed
// operator heading another stage is remote: records for it go to its
// repartition topic.

// taskScope restricts a jobRun to one scale-out task.
type taskScope struct {
	head *node
	// split is the split a source stage's task reads.
	split string
	// kgStart, kgEnd: the key groups of a keyed stage's task.
	kgStart, kgEnd uint16
	// local are the nodes that run in this task.
	local map[*node]bool
	io    *scaleIO
	// task and owner tag what the task writes to repartition topics.
	task  string
	owner uint64
	// origins are the upstream tasks feeding a keyed stage's task.
	origins []string
	// commit publishes the task's checkpoints.
	commit runtime.CommitHook
	// chains is what the task's sources and sinks are bound with.
	chains jobinfo.Chains
}

// scaleIO is what a scaled run needs of the broker.
type scaleIO struct {
	client   *client.Client
	producer *client.Producer
	group    string
	dec      decider
	// repart names a keyed stage's repartition topic and its queues, by
	// range.
	repart func(n *node) (topic string, queues []protocol.MessageQueue)
	// input is the repartition queue a keyed stage's task reads.
	input protocol.MessageQueue
	// readUncommitted is failpoint.Scaleout.ReadUncommitted.
	readUncommitted bool
}

// isStageHead reports whether n heads a stage.
func isStageHead(n *node) bool {
	return n.kind == kindSource || (n.exchange && n.kind != kindSink && !n.prePartitioned)
}

// stageHeads lists the job's stage heads in graph order.
func (j *Job) stageHeads() []*node {
	var hs []*node
	for _, n := range j.nodes {
		if isStageHead(n) {
			hs = append(hs, n)
		}
	}
	return hs
}

// stageNodes returns the nodes of head's stage: reachable from head (its
// outputs, side outputs and dead-letter sinks) without entering another
// stage's head.
func stageNodes(head *node) map[*node]bool {
	local := map[*node]bool{head: true}
	var walk func(n *node)
	walk = func(n *node) {
		if d := n.job.dlqNode(n.policy); d != nil {
			local[d] = true
		}
		for _, c := range append(append([]*node(nil), n.outs...), n.sides...) {
			if local[c] || isStageHead(c) {
				continue
			}
			local[c] = true
			walk(c)
		}
	}
	walk(head)
	return local
}

// remote reports whether, in this run, n is another stage's keyed head
// (records for it go to its repartition topic).
func (r *jobRun) remote(n *node) bool {
	return r.scope != nil && n.exchange && n.kind != kindSink && !r.scope.local[n]
}

// inScope reports whether node n runs in this run.
func (r *jobRun) inScope(n *node) bool { return r.scope == nil || r.scope.local[n] }

// keyGroupsOf returns the key groups keyed subtask sub of n covers in this
// run.
func (r *jobRun) keyGroupsOf(n *node, sub int) (start, end uint16) {
	maxP := r.job.cfg.maxParallelism
	if r.scope == nil {
		return state.KeyGroupRange(maxP, n.parallelism, sub)
	}
	if n == r.scope.head {
		return r.scope.kgStart, r.scope.kgEnd
	}
	return 0, uint16(maxP) // a PrePartitioned operator: its task owns every key of its queue
}

// originTag is what a remote port tags its batches with.
func (r *jobRun) originTag() (task string, owner uint64) { return r.scope.task, r.scope.owner }

// keyGroupRangeOf is the key groups of range r of n ranges.
func keyGroupRangeOf(maxP, n, r int) (start, end uint16) { return state.KeyGroupRange(maxP, n, r) }
