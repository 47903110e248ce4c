// Command runnel is runnel's command line: the embedded RocketMQ-compatible
// name server and broker (`runnel broker`, run with package embedded), the
// demos on an embedded cluster (`runnel demo`, `runnel demo wordcount`),
// topic administration, produce/consume and group tools, and checkpoint and
// savepoint inspection.
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
	root.AddCommand(newCheckpointCmd(), newSavepointCmd())
	return root
}
