// Command runnel is runnel's command line: the embedded RocketMQ-compatible
// name server and broker (`runnel broker`, run with package embedded), the
// demos on an embedded cluster (`runnel demo`, `runnel demo wordcount`),
// topic administration, produce/consume and group tools, a scale-out job's
// task assignment (`runnel job`), and checkpoint and savepoint inspection.
//
// The CLI is built on spf13/cobra: subcommands, flag parsing, help and shell
// completion are what it does well, and writing them by hand would only add
// code to maintain.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "runnel:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "runnel",
		Short:         "Flink-style stream processing in Go over the RocketMQ protocol",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newBrokerCmd(), newDemoCmd())
	root.AddCommand(newTopicCmd(), newProduceCmd(), newConsumeCmd(), newGroupCmd())
	root.AddCommand(newJobCmd(), newCheckpointCmd(), newSavepointCmd())
	failOnUnknownSubcommands(root)
	return root
}

// failOnUnknownSubcommands makes every command that only groups
// subcommands (topic, group, checkpoint …) fail on an argument that names
// none, with cobra's suggestions, instead of printing its help and
// exiting 0 (`runnel topic creat x`); without arguments it prints its help.
func failOnUnknownSubcommands(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		failOnUnknownSubcommands(sub)
	}
	if cmd.Runnable() || !cmd.HasSubCommands() || cmd.Parent() == nil {
		return // the root: cobra itself rejects unknown commands there
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if c.SuggestionsMinimumDistance <= 0 {
			c.SuggestionsMinimumDistance = 2 // cobra's default for the root
		}
		if sugg := c.SuggestionsFor(args[0]); len(sugg) > 0 {
			msg += "; did you mean " + strings.Join(sugg, " or ") + "?"
		}
		return fmt.Errorf("%s (see `%s --help`)", msg, c.CommandPath())
	}
}
