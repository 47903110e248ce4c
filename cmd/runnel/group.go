package main

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func newGroupCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "Show a consumer group's committed offsets and lag",
		Long: `Shows what a consumer group committed on the brokers for one topic.

runnel jobs keep their offsets in their checkpoints; the RocketMQ source also
reports them to the brokers under its group (default "runnel_<topic>") after
every checkpoint, so these commands show a job's progress and lag as well as
any RocketMQ consumer's.

Examples:
  runnel group offsets runnel_orders --topic orders
  runnel group lag runnel_orders --topic orders`,
	}
	cmd.AddCommand(newGroupOffsetsCmd("offsets"), newGroupOffsetsCmd("lag"))
	return cmd
}

func newGroupOffsetsCmd(which string) *cobra.Command {
	var (
		cf    clusterFlags
		topic string
	)
	short := "Per queue: the group's committed offset and the queue's max offset"
	long := `Prints, for every queue of --topic, the offset GROUP committed ("-" when it
committed none), the queue's max offset (the offset of the next message) and
the lag between them.`
	if which == "lag" {
		short = "Per queue lag of a group (max offset - committed offset) and the total"
		long = `Prints, for every queue of --topic, how many messages GROUP has not consumed
yet: the queue's max offset minus the committed offset (for a queue without a
committed offset, minus the queue's min offset: everything stored), and the
total over all queues.`
	}
	cmd := &cobra.Command{
		Use:   which + " GROUP --topic TOPIC",
		Short: short,
		Long:  long + "\n\nExample:\n  runnel group " + which + " runnel_orders --topic orders",
		Args:  exactArgs(1, "GROUP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if topic == "" {
				return fmt.Errorf("--topic is required: a group's offsets are per topic (see `%s --help`)", cmd.CommandPath())
			}
			return runGroupOffsets(cmd.Context(), cmd.OutOrStdout(), &cf, args[0], topic, which == "lag")
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&topic, "topic", "", "the topic (required)")
	return cmd
}

func runGroupOffsets(ctx context.Context, out io.Writer, cf *clusterFlags, group, topic string, lagOnly bool) error {
	c, err := cf.client()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := cf.route(ctx, c, topic); err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	offs, err := c.ConsumerOffsets(octx, group, topic)
	if err != nil {
		return cf.wrap(err, "offsets of group %q on %s", group, topic)
	}
	qs := make([]protocol.MessageQueue, 0, len(offs))
	for q := range offs {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, protocol.MessageQueue.Compare)
	tw := newTable(out)
	if lagOnly {
		fmt.Fprintln(tw, "QUEUE\tLAG")
	} else {
		fmt.Fprintln(tw, "QUEUE\tCOMMITTED\tMAX\tLAG")
	}
	var total int64
	committedAny := false
	for _, q := range qs {
		w := offs[q]
		committed := "-"
		var lag int64
		if w.ConsumerOffset >= 0 {
			committedAny = true
			committed = fmt.Sprint(w.ConsumerOffset)
			lag = max(w.BrokerOffset-w.ConsumerOffset, 0)
		} else {
			lo, err := c.MinOffset(octx, q)
			if err != nil {
				return fmt.Errorf("min offset of %s: %w", queueName(q), err)
			}
			lag = max(w.BrokerOffset-lo, 0)
		}
		total += lag
		if lagOnly {
			fmt.Fprintf(tw, "%s\t%d\n", queueName(q), lag)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", queueName(q), committed, w.BrokerOffset, lag)
		}
	}
	if lagOnly {
		fmt.Fprintf(tw, "total\t%d\n", total)
	} else {
		fmt.Fprintf(tw, "total\t\t\t%d\n", total)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !committedAny {
		fmt.Fprintf(out, "group %s has committed no offset on %s (unknown group, or it has consumed nothing yet)\n", group, topic)
	}
	return nil
}
