package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// clusterFlags are the flags of every command that talks to a cluster.
type clusterFlags struct {
	namesrv string
	timeout time.Duration
}

// add registers --namesrv and --timeout on cmd.
func (f *clusterFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.namesrv, "namesrv", namesrv.DefaultListenAddr, `name server addresses, ";"-separated`)
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "bound on each request and on waiting for a new topic's route")
}

// client returns a Client of the name servers of --namesrv. The caller closes
// it.
func (f *clusterFlags) client() (*client.Client, error) {
	var addrs []string
	for a := range strings.SplitSeq(f.namesrv, ";") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, errors.New("--namesrv names no address")
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %v must be positive", f.timeout)
	}
	c, err := client.New(client.WithNameServers(addrs...), client.WithRequestTimeout(f.timeout),
		client.WithDialTimeout(f.timeout), client.WithInstanceName("runnel-cli"))
	if err != nil {
		return nil, fmt.Errorf("--namesrv %q: %w", f.namesrv, err)
	}
	return c, nil
}

// route returns topic's route, turning "no such topic" and "no name server"
// into errors a person can act on.
func (f *clusterFlags) route(ctx context.Context, c *client.Client, topic string) (*client.TopicRoute, error) {
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	r, err := c.RefreshRoute(rctx, topic)
	switch {
	case err == nil:
		if len(r.Data.QueueDatas) == 0 {
			return nil, fmt.Errorf("topic %q has no queues", topic)
		}
		return r, nil
	case errors.Is(err, protocol.ErrTopicNotExist):
		return nil, fmt.Errorf("unknown topic %q: the name server at %s does not know it (see `runnel topic list`, or create it with `runnel topic create %s`)", topic, f.namesrv, topic)
	case unreachable(err):
		return nil, f.unreachable(err)
	default:
		return nil, fmt.Errorf("route of topic %q: %w", topic, err)
	}
}

// unreachable reports whether err says that no name server (or broker)
// could be reached.
func unreachable(err error) bool {
	return errors.Is(err, client.ErrNoNameServer) || errors.Is(err, client.ErrUnreachable)
}

// unreachable is the error of a command whose name servers did not answer,
// with the hint that every cluster command gives.
func (f *clusterFlags) unreachable(err error) error {
	return fmt.Errorf("no name server reachable at %s (is `runnel broker` running? set --namesrv): %w", f.namesrv, err)
}

// wrap returns err with what failed, or the unreachable hint when no name
// server answered.
func (f *clusterFlags) wrap(err error, what string, args ...any) error {
	if unreachable(err) {
		return f.unreachable(err)
	}
	return fmt.Errorf(what+": %w", append(args, err)...)
}

// plural returns "1 message", "2 messages".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// readQueues lists the readable queues of a route, sorted.
func readQueues(r *client.TopicRoute) []protocol.MessageQueue {
	return r.SubscribeQueues()
}

// newTable returns a tabwriter for aligned columns on w; call Flush.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// queueName is the short "brokerName/queueId" form used in tables, the
// same as the RocketMQ source's split IDs.
func queueName(q protocol.MessageQueue) string {
	return fmt.Sprintf("%s/%d", q.BrokerName, q.QueueID)
}

// parseTime accepts RFC 3339 times, "2006-01-02 15:04:05" (local), and Unix
// milliseconds.
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation("2006-01-02 15:04:05", s, time.Local); err == nil {
		return t, nil
	}
	var ms int64
	if _, err := fmt.Sscanf(s, "%d", &ms); err == nil && fmt.Sprint(ms) == s {
		return time.UnixMilli(ms), nil
	}
	return time.Time{}, fmt.Errorf("time %q is neither RFC 3339 (2024-05-01T12:00:00Z), \"2024-05-01 12:00:00\" nor Unix milliseconds", s)
}
