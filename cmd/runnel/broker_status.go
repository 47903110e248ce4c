package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func newBrokerStatusCmd() *cobra.Command {
	var cf clusterFlags
	var addrs string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every broker's replication: roles, log ends, slaves and their lag",
		Long: `Asks every broker the name servers list (or the --broker addresses) for its
replication status (GET_BROKER_HA_STATUS, what mqadmin haStatus shows) and
prints one line per broker: its name, id, address, role and log end (the
physical offset of its next record); for a master each connected slave with
the log end it acknowledged, its lag in bytes and the bytes per second sent
to it, for a slave its master's HA address, how far behind it is and the
bytes per second it receives. The broker's metrics (package otel) carry the
same figures, and the bytes replicated in total.

Examples:
  runnel broker status
  runnel broker status --namesrv 10.0.0.1:9876
  runnel broker status --broker 127.0.0.1:10911`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBrokerStatus(cmd.Context(), cmd.OutOrStdout(), &cf, addrs)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&addrs, "broker", "", `broker addresses to ask, ";"-separated (default: every broker the name servers list)`)
	return cmd
}

// statusRow is one broker of the status table.
type statusRow struct {
	name string
	id   int64
	addr string
}

func runBrokerStatus(ctx context.Context, out io.Writer, cf *clusterFlags, addrs string) error {
	c, err := cf.client()
	if err != nil {
		return err
	}
	defer c.Close()
	var rows []statusRow
	if addrs != "" {
		for _, a := range splitAddrs(addrs) {
			rows = append(rows, statusRow{name: "?", id: -1, addr: a})
		}
	} else {
		cctx, cancel := context.WithTimeout(ctx, cf.timeout)
		ci, err := c.ClusterInfo(cctx)
		cancel()
		if err != nil {
			return cf.wrap(err, "cluster info")
		}
		for _, name := range slices.Sorted(maps.Keys(ci.BrokerAddrTable)) {
			bd := ci.BrokerAddrTable[name]
			for _, id := range slices.Sorted(maps.Keys(bd.BrokerAddrs)) {
				rows = append(rows, statusRow{name: name, id: id, addr: bd.BrokerAddrs[id]})
			}
		}
		if len(rows) == 0 {
			fmt.Fprintf(out, "the name server at %s lists no broker\n", cf.namesrv)
			return nil
		}
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "BROKER\tID\tADDRESS\tROLE\tLOG END\tREPLICATION")
	failed := 0
	for _, r := range rows {
		sctx, cancel := context.WithTimeout(ctx, cf.timeout)
		info, err := c.BrokerHAStatus(sctx, r.addr)
		cancel()
		id := fmt.Sprint(r.id)
		if r.id < 0 {
			id = "?"
		}
		if err != nil {
			failed++
			fmt.Fprintf(tw, "%s\t%s\t%s\t?\t?\t%v\n", r.name, id, r.addr, err)
			continue
		}
		role, end, repl := describeHA(info)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.name, id, r.addr, role, end, repl)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed == len(rows) {
		return fmt.Errorf("no broker answered its replication status")
	}
	return nil
}

// describeHA returns the role, log end and replication column of a
// broker's HA status.
func describeHA(info *protocol.HARuntimeInfo) (role string, end int64, repl string) {
	if info.Master {
		var parts []string
		for _, s := range info.HAConnectionInfo {
			sync := "in sync"
			if !s.InSync {
				sync = "NOT in sync"
			}
			parts = append(parts, fmt.Sprintf("slave %s acked %d (lag %s, %s, sending %s/s)", s.Addr, s.SlaveAckOffset,
				humanSize(s.Diff), sync, humanSize(s.TransferredByteInSecond)))
		}
		if len(parts) == 0 {
			parts = append(parts, "no slave connected")
		}
		return "master", info.MasterCommitLogMaxOffset, strings.Join(parts, "; ")
	}
	cl := info.HAClientRuntimeInfo
	lag := max(cl.MasterFlushOffset-cl.MaxOffset, 0)
	master := cl.MasterAddr
	if master == "" {
		master = "(unknown master)"
	}
	return "slave", cl.MaxOffset, fmt.Sprintf("from %s, master at %d (lag %s, receiving %s/s)", master, cl.MasterFlushOffset,
		humanSize(lag), humanSize(cl.TransferredByteInSecond))
}

// humanSize formats a byte count: 512 B, 1.5 KiB, 3.2 MiB.
func humanSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
