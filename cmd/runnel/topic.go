package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func newTopicCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topic",
		Short: "Create, list, describe and delete topics",
		Long: `Administers the topics of a RocketMQ cluster (or of ` + "`runnel broker`" + `) through
its name server (--namesrv, default 127.0.0.1:9876).

Examples:
  runnel topic create orders --queues 8
  runnel topic list
  runnel topic describe orders      # queues, min/max offsets, route
  runnel topic delete orders`,
	}
	cmd.AddCommand(newTopicCreateCmd(), newTopicListCmd(), newTopicDescribeCmd(), newTopicDeleteCmd())
	return cmd
}

func newTopicCreateCmd() *cobra.Command {
	var (
		cf      clusterFlags
		queues  int
		target  string
		perm    string
		order   bool
		noWait  bool
		force   bool
		cluster string
	)
	cmd := &cobra.Command{
		Use:   "create TOPIC",
		Short: "Create a topic (or update its queue count and permissions)",
		Long: `Creates TOPIC with --queues read and write queues on every master broker of
--cluster (default ` + broker.DefaultClusterName + `), or on the one broker --broker names, then waits
until the name server routes it (so the next command finds it). Creating a
topic that exists updates its configuration. Fewer --queues than the topic has
would make the messages of the queues beyond unreadable: the command refuses,
saying how many messages they hold, unless --force is given.

Examples:
  runnel topic create orders
  runnel topic create orders --queues 16 --perm r    # read-only
  runnel topic create orders --broker 127.0.0.1:10911 --namesrv 10.0.0.5:9876`,
		Args: exactArgs(1, "TOPIC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			topic := args[0]
			if queues < 1 || queues > 1024 {
				return fmt.Errorf("--queues %d: must be between 1 and 1024", queues)
			}
			p, err := parsePerm(perm)
			if err != nil {
				return err
			}
			if len(topic) > client.MaxTopicLength || strings.ContainsAny(topic, " \t\n/") {
				return fmt.Errorf("topic name %q: at most %d characters, no spaces or slashes", topic, client.MaxTopicLength)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			dest := cluster
			if target != "" {
				dest = target
			}
			shrink, err := checkShrink(ctx, &cf, c, topic, target, queues)
			if err != nil {
				return err
			}
			if shrink != nil && !force {
				return fmt.Errorf("topic %s has %d queues on %s; --queues %d would make queues %d-%d unreadable to consumers, hiding %s they still hold; pass --force to shrink it anyway",
					topic, shrink.from, strings.Join(shrink.brokers, ", "), queues, queues, shrink.from-1, plural(shrink.messages, "message"))
			}
			tc := client.TopicConfig{TopicName: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues), Perm: p, Order: order}
			cctx, cancel := context.WithTimeout(ctx, cf.timeout)
			err = c.CreateTopic(cctx, dest, tc)
			cancel()
			if err != nil {
				return cf.wrap(err, "create topic %q on %s", topic, dest)
			}
			if shrink != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "runnel: shrank topic %s from %d to %d queues (--force): %s in queues %d-%d are no longer readable\n",
					topic, shrink.from, queues, plural(shrink.messages, "message"), queues, shrink.from-1)
			}
			if !noWait {
				if err := waitRoute(ctx, c, topic, queues, cf.timeout); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created topic %s (%d queues, perm %s) on %s\n", topic, queues, permString(p), dest)
			return nil
		},
	}
	cf.add(cmd)
	fl := cmd.Flags()
	fl.IntVar(&queues, "queues", client.DefaultAdminQueueNums, "number of read and write queues per broker")
	fl.StringVar(&cluster, "cluster", broker.DefaultClusterName, "cluster whose master brokers get the topic")
	fl.StringVar(&target, "broker", "", "create on this one broker address (host:port) instead of a cluster")
	fl.StringVar(&perm, "perm", "rw", "permissions: rw, r or w")
	fl.BoolVar(&order, "order", false, "mark the topic as ordered")
	fl.BoolVar(&noWait, "no-wait", false, "do not wait for the name server to route the topic")
	fl.BoolVar(&force, "force", false, "shrink an existing topic to fewer queues, making the messages of the others unreadable")
	return cmd
}

// shrinkage is what updating an existing topic to fewer queues would hide.
type shrinkage struct {
	from     int      // the most read queues of an affected broker
	brokers  []string // the brokers whose queues shrink
	messages int64    // messages held in the queues that become unreadable
}

// checkShrink looks up topic's current route: when giving it queues read
// queues on the brokers create targets (the broker at target, or all)
// would drop queues, it returns what would become unreadable (nil when
// nothing shrinks or the topic does not exist).
func checkShrink(ctx context.Context, cf *clusterFlags, c *client.Client, topic, target string, queues int) (*shrinkage, error) {
	rctx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	r, err := c.RefreshRoute(rctx, topic)
	switch {
	case errors.Is(err, protocol.ErrTopicNotExist):
		return nil, nil
	case err != nil:
		return nil, cf.wrap(err, "route of topic %q", topic)
	}
	var sh shrinkage
	for _, qd := range r.Data.QueueDatas {
		if int(qd.ReadQueueNums) <= queues {
			continue
		}
		if target != "" {
			master := ""
			for _, bd := range r.Data.BrokerDatas {
				if bd.BrokerName == qd.BrokerName {
					master = bd.BrokerAddrs[0]
				}
			}
			if master != target {
				continue
			}
		}
		sh.from = max(sh.from, int(qd.ReadQueueNums))
		sh.brokers = append(sh.brokers, qd.BrokerName)
		for id := queues; id < int(qd.ReadQueueNums); id++ {
			q := protocol.MessageQueue{Topic: topic, BrokerName: qd.BrokerName, QueueID: int32(id)}
			lo, err1 := c.MinOffset(rctx, q)
			hi, err2 := c.MaxOffset(rctx, q)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("offsets of %s: %w", queueName(q), err)
			}
			sh.messages += max(hi-lo, 0)
		}
	}
	if sh.brokers == nil {
		return nil, nil
	}
	slices.Sort(sh.brokers)
	return &sh, nil
}

// waitRoute polls the name server until topic is routed with at least
// queues readable queues (brokers register new topics asynchronously).
func waitRoute(ctx context.Context, c *client.Client, topic string, queues int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		r, err := c.RefreshRoute(rctx, topic)
		cancel()
		if err == nil && len(r.SubscribeQueues()) >= queues {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%d readable queues routed", len(r.SubscribeQueues()))
			}
			return fmt.Errorf("topic %q was created but the name server does not route it yet after %v: %w", topic, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func parsePerm(s string) (int32, error) {
	switch strings.ToLower(s) {
	case "rw", "wr":
		return protocol.PermRead | protocol.PermWrite, nil
	case "r":
		return protocol.PermRead, nil
	case "w":
		return protocol.PermWrite, nil
	}
	return 0, fmt.Errorf("--perm %q: want rw, r or w", s)
}

func permString(p int32) string {
	s := ""
	if p&protocol.PermRead != 0 {
		s += "r"
	}
	if p&protocol.PermWrite != 0 {
		s += "w"
	}
	if s == "" {
		s = "-"
	}
	return s
}

// systemTopic reports topics RocketMQ keeps for itself (and the cluster and
// broker names name servers list as topics).
func systemTopic(t string, ci *protocol.ClusterInfo) bool {
	if t == client.DefaultTopic || strings.HasPrefix(t, "RMQ_SYS_") || strings.HasPrefix(t, "%RETRY%") ||
		strings.HasPrefix(t, "%DLQ%") || strings.HasPrefix(t, "rmq_sys_") || t == "SCHEDULE_TOPIC_XXXX" ||
		t == "OFFSET_MOVED_EVENT" || t == "BenchmarkTest" || t == "SELF_TEST_TOPIC" {
		return true
	}
	if ci != nil {
		if _, ok := ci.ClusterAddrTable[t]; ok {
			return true
		}
		if _, ok := ci.BrokerAddrTable[t]; ok {
			return true
		}
	}
	return false
}

func newTopicListCmd() *cobra.Command {
	var (
		cf  clusterFlags
		all bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the topics the name server knows",
		Long: `Lists the topics the name server knows, one per line, sorted. System topics
(TBW102, RMQ_SYS_*, %RETRY%/%DLQ% groups, cluster and broker names) are left
out unless --all is given.

Examples:
  runnel topic list
  runnel topic list --all --namesrv 10.0.0.5:9876`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			topics, err := c.ListTopics(ctx)
			if err != nil {
				return cf.wrap(err, "list topics at %s", cf.namesrv)
			}
			var ci *protocol.ClusterInfo
			if !all {
				ci, _ = c.ClusterInfo(ctx) // best effort: only to hide cluster/broker names
			}
			for _, t := range topics {
				if all || !systemTopic(t, ci) {
					fmt.Fprintln(cmd.OutOrStdout(), t)
				}
			}
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "include system topics")
	return cmd
}

func newTopicDescribeCmd() *cobra.Command {
	var cf clusterFlags
	cmd := &cobra.Command{
		Use:   "describe TOPIC",
		Short: "Show a topic's route and each queue's min/max offsets",
		Long: `Shows TOPIC's route (brokers with their addresses, queue counts and
permissions) and, for every readable queue, its min offset (the oldest message
still stored), max offset (the offset the next message gets) and the number of
messages it holds.

Example:
  runnel topic describe orders`,
		Args: exactArgs(1, "TOPIC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return describeTopic(cmd.Context(), cmd.OutOrStdout(), &cf, c, args[0])
		},
	}
	cf.add(cmd)
	return cmd
}

func describeTopic(ctx context.Context, out io.Writer, cf *clusterFlags, c *client.Client, topic string) error {
	r, err := cf.route(ctx, c, topic)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "topic %s\n\nroute:\n", topic)
	tw := newTable(out)
	fmt.Fprintln(tw, "  BROKER\tADDRESSES\tREAD\tWRITE\tPERM")
	qds := slices.Clone(r.Data.QueueDatas)
	slices.SortFunc(qds, func(a, b protocol.QueueData) int { return strings.Compare(a.BrokerName, b.BrokerName) })
	for _, qd := range qds {
		var addrs []string
		for _, bd := range r.Data.BrokerDatas {
			if bd.BrokerName != qd.BrokerName {
				continue
			}
			ids := make([]int64, 0, len(bd.BrokerAddrs))
			for id := range bd.BrokerAddrs {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			for _, id := range ids {
				role := "master"
				if id != 0 {
					role = fmt.Sprintf("slave %d", id)
				}
				addrs = append(addrs, fmt.Sprintf("%s (%s)", bd.BrokerAddrs[id], role))
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", qd.BrokerName, strings.Join(addrs, ", "), qd.ReadQueueNums, qd.WriteQueueNums, permString(qd.Perm))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nqueues:")
	tw = newTable(out)
	fmt.Fprintln(tw, "  QUEUE\tMIN OFFSET\tMAX OFFSET\tMESSAGES")
	var total int64
	for _, q := range readQueues(r) {
		qctx, cancel := context.WithTimeout(ctx, cf.timeout)
		lo, err1 := c.MinOffset(qctx, q)
		hi, err2 := c.MaxOffset(qctx, q)
		cancel()
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("offsets of %s: %w", queueName(q), err)
		}
		total += hi - lo
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\n", queueName(q), lo, hi, hi-lo)
	}
	fmt.Fprintf(tw, "  total\t\t\t%d\n", total)
	return tw.Flush()
}

func newTopicDeleteCmd() *cobra.Command {
	var (
		cf      clusterFlags
		cluster string
	)
	cmd := &cobra.Command{
		Use:   "delete TOPIC",
		Short: "Delete a topic from its brokers and the name servers",
		Long: `Deletes TOPIC from every master broker of its route (or of --cluster) and
from the name server. Its messages become unreadable. Deleting an unknown topic
is an error.

Example:
  runnel topic delete orders`,
		Args: exactArgs(1, "TOPIC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			if _, err := cf.route(ctx, c, args[0]); err != nil {
				return err
			}
			dctx, cancel := context.WithTimeout(ctx, cf.timeout)
			defer cancel()
			if err := c.DeleteTopic(dctx, args[0], cluster); err != nil {
				return cf.wrap(err, "delete topic %q", args[0])
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted topic %s\n", args[0])
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&cluster, "cluster", "", "delete from the masters of this cluster (default: those of the topic's route)")
	return cmd
}

// exactArgs is cobra.ExactArgs with a message naming the arguments.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%s takes %s (got %d arguments); see `%s --help`", cmd.CommandPath(), names, len(args), cmd.CommandPath())
		}
		return nil
	}
}

// noArgs is cobra.NoArgs with a pointer to --help.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments (got %q); see `%s --help`", cmd.CommandPath(), args, cmd.CommandPath())
	}
	return nil
}
