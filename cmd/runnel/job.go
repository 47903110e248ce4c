package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/internal/scaleout"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func newJobCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Show a scale-out job's tasks and workers (jobs run with pipeline.RunWorker)",
		Long: `Shows how a job that runs as many worker processes (pipeline.RunWorker, and
examples/etl by default) has its work shared, as the cluster itself records it:
every task's commit chain (the job's runnel_commit_<job>_<stage> topics), read to
its end, says which worker owns the task (its client id), under which owner
epoch, and its latest checkpoint; the broker's consumer list says which workers
are members of the job's consumer group now. Nothing is written.

A task is one queue of a source topic (a source stage) or one key-group range
(a keyed stage, fed through the job's repartition topic).

Examples:
  runnel job tasks etl
  runnel job workers etl --namesrv 10.0.0.5:9876
  runnel job tasks etl --json`,
	}
	cmd.AddCommand(newJobTasksCmd(), newJobWorkersCmd())
	return cmd
}

// jobFlags are the flags of the job commands.
type jobFlags struct {
	cf     clusterFlags
	group  string
	asJSON bool
}

func (f *jobFlags) add(cmd *cobra.Command) {
	f.cf.add(cmd)
	cmd.Flags().StringVar(&f.group, "group", "", "the workers' consumer group (default: the job's name, as pipeline.RunWorker uses unless WorkerGroup is set)")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print JSON instead of a table")
}

func newJobTasksCmd() *cobra.Command {
	var f jobFlags
	cmd := &cobra.Command{
		Use:   "tasks JOB",
		Short: "Every task of JOB: its owner, owner epoch, latest checkpoint, snapshot",
		Long: `Prints one line per task of JOB: the worker that wrote the task's latest valid
commit record (its owner; "(left)" when it is no longer a member of the job's
group: the task moves at the next rebalance), its owner epoch, the latest
checkpoint (or "claimed" when the owner has claimed the task and not completed a
checkpoint since), how long ago that record was written, the checkpoint of the
task's latest state snapshot in the broker and how many checkpoints' changelog
segments follow it (what a new owner replays). Then the group's members.

With --json: one object with the job's stages, tasks and members.

Examples:
  runnel job tasks etl
  runnel job tasks etl --json | jq '.tasks[] | select(.ownerMember | not)'`,
		Args: exactArgs(1, "JOB"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := loadJob(cmd.Context(), &f, args[0])
			if err != nil {
				return err
			}
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), v)
			}
			return printJobTasks(cmd.OutOrStdout(), v, time.Now())
		},
	}
	f.add(cmd)
	return cmd
}

func newJobWorkersCmd() *cobra.Command {
	var f jobFlags
	cmd := &cobra.Command{
		Use:   "workers JOB",
		Short: "The workers of JOB (members of its group) and how many tasks each owns",
		Long: `Prints one line per worker of JOB: every member of the job's consumer group and
every worker that owns a task by its commit chain, with how many tasks it owns
(per stage). A worker that owns tasks but is no longer a member has left (it
stopped or was killed): its tasks move at the next rebalance.

Examples:
  runnel job workers etl
  runnel job workers etl --json`,
		Args: exactArgs(1, "JOB"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := loadJob(cmd.Context(), &f, args[0])
			if err != nil {
				return err
			}
			ws := v.workers()
			if f.asJSON {
				return writeJSON(cmd.OutOrStdout(), struct {
					Job     string      `json:"job"`
					Group   string      `json:"group"`
					Workers []jobWorker `json:"workers"`
				}{v.Job, v.Group, ws})
			}
			return printJobWorkers(cmd.OutOrStdout(), v, ws)
		},
	}
	f.add(cmd)
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jobView is a job's tasks and members as the cluster records them.
type jobView struct {
	Job     string     `json:"job"`
	Group   string     `json:"group"`
	Stages  []jobStage `json:"stages"`
	Tasks   []jobTask  `json:"tasks"`
	Members []string   `json:"members"`
}

// jobStage is one stage of a job: the queues of its commit topic are its
// tasks.
type jobStage struct {
	Stage       string `json:"stage"`
	CommitTopic string `json:"commitTopic"`
	Tasks       int    `json:"tasks"`
}

// jobTask is one task and its commit chain's latest valid record.
type jobTask struct {
	Task  string `json:"task"`
	Stage string `json:"stage"`
	// Owner is the client id of the latest valid record's writer ("" when
	// the chain has no record yet).
	Owner       string `json:"owner"`
	OwnerMember bool   `json:"ownerMember"`
	OwnerEpoch  uint64 `json:"ownerEpoch"`
	// Checkpoint is the latest checkpoint; Claimed says the latest record
	// is a claim (the owner completed no checkpoint since it took the
	// task).
	Checkpoint uint64    `json:"checkpoint"`
	Claimed    bool      `json:"claimed"`
	Time       time.Time `json:"time,omitzero"`
	// Snapshot is the checkpoint of the latest snapshot in the broker (0:
	// none); Segments the changelog segments after it.
	Snapshot uint64 `json:"snapshot"`
	Segments int    `json:"segmentsSinceSnapshot"`
	Error    string `json:"error,omitempty"`
}

// jobWorker is one worker of a job and the tasks it owns.
type jobWorker struct {
	Worker string   `json:"worker"`
	Member bool     `json:"member"`
	Tasks  []string `json:"tasks"`
}

// workers lists the group's members and the tasks' owners, members first,
// each with its tasks.
func (v *jobView) workers() []jobWorker {
	by := map[string]*jobWorker{}
	for _, m := range v.Members {
		by[m] = &jobWorker{Worker: m, Member: true, Tasks: []string{}}
	}
	for _, t := range v.Tasks {
		if t.Owner == "" {
			continue
		}
		w := by[t.Owner]
		if w == nil {
			w = &jobWorker{Worker: t.Owner}
			by[t.Owner] = w
		}
		w.Tasks = append(w.Tasks, t.Task)
	}
	out := make([]jobWorker, 0, len(by))
	for _, k := range slices.Sorted(maps.Keys(by)) {
		out = append(out, *by[k])
	}
	slices.SortStableFunc(out, func(a, b jobWorker) int {
		switch {
		case a.Member == b.Member:
			return 0
		case a.Member:
			return -1
		}
		return 1
	})
	return out
}

// errNoJob is returned when the cluster has no commit topic of the job.
var errNoJob = errors.New("no such job")

// loadJob finds job's stages, follows every task's commit chain once to its
// end and asks a broker for the group's members.
func loadJob(ctx context.Context, f *jobFlags, job string) (*jobView, error) {
	group := f.group
	if group == "" {
		group = scaleout.GroupName(job)
	}
	c, err := f.cf.client()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, f.cf.timeout)
	defer cancel()
	v, err := readJob(ctx, c, job, group)
	switch {
	case errors.Is(err, errNoJob):
		return nil, fmt.Errorf("%w: the cluster at %s has no commit topic of job %q (%s...): it never ran as workers (pipeline.RunWorker), or under another name (see `runnel topic list`)",
			errNoJob, f.cf.namesrv, job, scaleout.TopicName(job, "STAGE", scaleout.KindCommit))
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("%w (within --timeout %v)", err, f.cf.timeout)
	case err != nil:
		return nil, f.cf.wrap(err, "job %s", job)
	}
	return v, nil
}

// readJob is loadJob on c.
func readJob(ctx context.Context, c *client.Client, job, group string) (*jobView, error) {
	v := &jobView{Job: job, Group: group, Stages: []jobStage{}, Tasks: []jobTask{}, Members: []string{}}
	topics, err := c.ListTopics(ctx)
	if err != nil {
		return nil, err
	}
	type stageQueues struct {
		jobStage
		queues []protocol.MessageQueue
	}
	var stages []stageQueues
	// Every commit topic of job starts with its name for the stage "" minus
	// the hash suffix (scaleout.TopicName keeps the job's part first).
	pfx := hashSuffix.ReplaceAllString(scaleout.TopicName(job, "", scaleout.KindCommit), "")
	for _, t := range topics {
		if !strings.HasPrefix(t, pfx) {
			continue
		}
		r, err := c.RefreshRoute(ctx, t)
		if errors.Is(err, protocol.ErrTopicNotExist) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("route of %s: %w", t, err)
		}
		qs := r.SubscribeQueues()
		stage, ok := stageOfName(job, t)
		if !ok {
			if stage, ok, err = stageOfRecords(ctx, c, job, group, t, qs); err != nil {
				return nil, err
			}
		}
		if ok {
			stages = append(stages, stageQueues{jobStage{Stage: stage, CommitTopic: t, Tasks: len(qs)}, qs})
		}
	}
	if len(stages) == 0 {
		return nil, errNoJob
	}
	slices.SortFunc(stages, func(a, b stageQueues) int { return strings.Compare(a.Stage, b.Stage) })

	gc, err := client.NewGroupConsumer(c, group)
	if err != nil {
		return nil, err
	}
	members, err := gc.Members(ctx, stages[0].CommitTopic)
	_ = gc.Close() // never started: nothing to leave
	switch {
	case err == nil:
		v.Members = members
	case !noConsumer(err):
		return nil, fmt.Errorf("members of group %s: %w", group, err)
	}

	fl := scaleout.NewFollower(c, group, nil)
	defer func() { _ = fl.Close() }()
	for _, s := range stages {
		v.Stages = append(v.Stages, s.jobStage)
		for _, q := range s.queues {
			id := scaleout.TaskID{Stage: s.Stage, Broker: q.BrokerName, Queue: q.QueueID}.String()
			fl.Follow(id, q)
			v.Tasks = append(v.Tasks, jobTask{Task: id, Stage: s.Stage})
		}
	}
	for i := range v.Tasks {
		t := &v.Tasks[i]
		if err := fl.Ready(ctx, t.Task); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("reading task %s's commit chain: %w", t.Task, err)
			}
			t.Error = err.Error()
			continue
		}
		cv, err := fl.View(t.Task)
		if err != nil {
			t.Error = err.Error()
			continue
		}
		if r := cv.Latest; r != nil {
			t.Owner, t.OwnerEpoch, t.Checkpoint = r.Worker, r.OwnerEpoch, r.Seq
			t.Claimed = r.Kind == scaleout.KindClaim
			t.Time = time.UnixMilli(r.TimeMs)
			t.Snapshot, t.Segments = r.Snapshot.Seq, len(r.Segments)
			t.OwnerMember = slices.Contains(v.Members, r.Worker)
		}
	}
	return v, nil
}

// noConsumer reports whether err is a broker's answer that a group has no
// member (Java's ConsumerManageProcessor: SYSTEM_ERROR "no consumer for
// this group, <group>"; some versions capitalise it).
func noConsumer(err error) bool {
	var pe *protocol.Error
	return errors.As(err, &pe) && pe.Code == protocol.ResSystemError && strings.HasPrefix(strings.ToLower(pe.Remark), "no consumer for this group")
}

// hashSuffix is the end of a job topic name that scaleout.TopicName had to
// shorten or disambiguate.
var hashSuffix = regexp.MustCompile(`_[0-9a-f]{12}$`)

// stageOfName returns the stage of job whose commit topic is topic, when the
// name alone tells it: some tail of the name (after an '_', without a hash
// suffix) names a stage for which scaleout.TopicName gives topic. Stages
// whose names were shortened or had characters replaced are not found this
// way (stageOfRecords is).
func stageOfName(job, topic string) (string, bool) {
	rest := strings.TrimPrefix(topic, "runnel_"+scaleout.KindCommit+"_")
	for i := range len(rest) {
		if rest[i] != '_' {
			continue
		}
		tail := rest[i+1:]
		for _, cand := range []string{tail, hashSuffix.ReplaceAllString(tail, "")} {
			if cand != "" && scaleout.TopicName(job, cand, scaleout.KindCommit) == topic {
				return cand, true
			}
		}
	}
	return "", false
}

// stageOfRecords returns the stage of job whose commit topic is topic from
// the task its first readable record names.
func stageOfRecords(ctx context.Context, c *client.Client, job, group, topic string, qs []protocol.MessageQueue) (string, bool, error) {
	for _, q := range qs {
		lo, err := c.MinOffset(ctx, q)
		if err != nil {
			return "", false, err
		}
		hi, err := c.MaxOffset(ctx, q)
		if err != nil {
			return "", false, err
		}
		if hi <= lo {
			continue
		}
		res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: lo, MaxMsgs: 1, Group: group})
		if err != nil {
			return "", false, fmt.Errorf("reading %s: %w", queueName(q), err)
		}
		if res.Status != client.PullFound || len(res.Messages) == 0 {
			continue
		}
		r, err := scaleout.DecodeRecord(res.Messages[0].Body)
		if err != nil {
			return "", false, nil // not a commit topic of this runnel build
		}
		id, err := scaleout.ParseTaskID(r.Task)
		if err != nil {
			return "", false, nil
		}
		return id.Stage, scaleout.TopicName(job, id.Stage, scaleout.KindCommit) == topic, nil
	}
	return "", false, nil
}

// age is how long ago t was, for tables.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s" // the writer's clock is ahead
	case d < time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func printJobTasks(out io.Writer, v *jobView, now time.Time) error {
	stages := make([]string, len(v.Stages))
	for i, s := range v.Stages {
		stages[i] = fmt.Sprintf("%s (%s, %d)", s.Stage, s.CommitTopic, s.Tasks)
	}
	fmt.Fprintf(out, "job %s, group %s: %s in %d stages: %s\n", v.Job, v.Group, plural(int64(len(v.Tasks)), "task"), len(v.Stages), strings.Join(stages, ", "))
	tw := newTable(out)
	fmt.Fprintln(tw, "TASK\tOWNER\tEPOCH\tCHECKPOINT\tAGE\tSNAPSHOT\tSEGMENTS")
	left := 0
	for _, t := range v.Tasks {
		if t.Error != "" {
			fmt.Fprintf(tw, "%s\t(unreadable: %s)\t\t\t\t\t\n", t.Task, t.Error)
			continue
		}
		if t.Owner == "" {
			fmt.Fprintf(tw, "%s\t(no owner yet)\t-\t-\t-\t-\t-\n", t.Task)
			continue
		}
		owner := t.Owner
		if !t.OwnerMember {
			owner += " (left)"
			left++
		}
		ckpt := fmt.Sprint(t.Checkpoint)
		if t.Claimed {
			ckpt += " claimed"
		}
		snap := "-"
		if t.Snapshot > 0 {
			snap = fmt.Sprint(t.Snapshot)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\n", t.Task, owner, t.OwnerEpoch, ckpt, age(now, t.Time), snap, t.Segments)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Members) == 0 {
		fmt.Fprintf(out, "group %s has no member: no worker of the job is running\n", v.Group)
	} else {
		fmt.Fprintf(out, "group %s: %s: %s\n", v.Group, plural(int64(len(v.Members)), "member"), strings.Join(v.Members, ", "))
	}
	if left > 0 && len(v.Members) > 0 {
		fmt.Fprintf(out, "%s owned by a worker that left the group: they move at the next rebalance\n", plural(int64(left), "task"))
	}
	return nil
}

func printJobWorkers(out io.Writer, v *jobView, ws []jobWorker) error {
	fmt.Fprintf(out, "job %s, group %s: %s, %s\n", v.Job, v.Group, plural(int64(len(v.Members)), "member"), plural(int64(len(v.Tasks)), "task"))
	tw := newTable(out)
	fmt.Fprintln(tw, "WORKER\tMEMBER\tTASKS\tBY STAGE")
	owned, unreadable := 0, 0
	for _, t := range v.Tasks {
		if t.Error != "" {
			unreadable++
		}
	}
	for _, w := range ws {
		per := map[string]int{}
		for _, t := range w.Tasks {
			if id, err := scaleout.ParseTaskID(t); err == nil {
				per[id.Stage]++
			}
		}
		var by []string
		for _, s := range v.Stages {
			if per[s.Stage] > 0 {
				by = append(by, fmt.Sprintf("%s %d", s.Stage, per[s.Stage]))
			}
		}
		member := "yes"
		if !w.Member {
			member = "no (left)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", w.Worker, member, len(w.Tasks), strings.Join(by, ", "))
		owned += len(w.Tasks)
	}
	if n := len(v.Tasks) - owned - unreadable; n > 0 {
		fmt.Fprintf(tw, "(no owner yet)\t\t%d\t\n", n)
	}
	if unreadable > 0 {
		fmt.Fprintf(tw, "(chain unreadable: see `runnel job tasks`)\t\t%d\t\n", unreadable)
	}
	return tw.Flush()
}
