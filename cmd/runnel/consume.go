package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

type consumeFlags struct {
	cf     clusterFlags
	from   string
	queue  int
	count  int64
	tag    string
	group  string
	asJSON bool
	idle   time.Duration
}

func newConsumeCmd() *cobra.Command {
	var f consumeFlags
	cmd := &cobra.Command{
		Use:   "consume TOPIC",
		Short: "Tail a topic: print its messages as they arrive",
		Long: `Reads every queue of TOPIC (or only --queue) and prints each message on one
line: queue, offset, tags, keys, user properties and the body as it is (a body
holding newlines or binary data spans lines as it stands: --json prints each
message as one JSON object, its body escaped). It starts at
--from and keeps tailing until interrupted (Ctrl-C), until --count messages
were printed, or until no message arrived for --idle.

--from is one of:
  latest      only messages stored from now on (default)
  earliest    everything each queue still holds
  N           queue offset N in every queue (clamped to what the queue holds)
  TIME        the first message stored at or after TIME (RFC 3339, or
              "2006-01-02 15:04:05" local time, or Unix milliseconds)

Nothing is committed to the broker: consuming does not move any consumer
group's offsets. A line "consuming ..." on stderr tells when positions are
fixed (messages produced after it are printed even with --from latest).

Examples:
  runnel consume orders                       # tail new messages
  runnel consume orders --from earliest --count 10
  runnel consume orders --from 2024-05-01T12:00:00Z --tag 'created || paid'
  runnel consume orders --from 0 --queue 3 --json`,
		Args: exactArgs(1, "TOPIC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runConsume(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], &f, cmd.Flags().Changed("queue"))
		},
	}
	f.cf.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.from, "from", "latest", "where to start: latest, earliest, an offset N, or a time")
	fl.IntVar(&f.queue, "queue", 0, "read only this queue id (default: every queue)")
	fl.Int64Var(&f.count, "count", 0, "stop after this many messages (0 = no limit)")
	fl.StringVar(&f.tag, "tag", "*", `tag expression: "*" for all, "a || b" for tags a or b`)
	fl.StringVar(&f.group, "group", "runnel_cli_consume", "consumer group named in pull requests (no offset is committed)")
	fl.BoolVar(&f.asJSON, "json", false, "print one JSON object per message")
	fl.DurationVar(&f.idle, "idle", 0, "stop when no message arrived for this long (0 = never)")
	return cmd
}

// startPos is a parsed --from.
type startPos struct {
	kind   string // latest, earliest, offset, time
	offset int64
	t      time.Time
}

func parseFrom(s string) (startPos, error) {
	switch s {
	case "latest", "earliest":
		return startPos{kind: s}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 && n < 1e12 {
		return startPos{kind: "offset", offset: n}, nil // Unix ms are ≥ 1e12
	}
	t, err := parseTime(s)
	if err != nil {
		return startPos{}, fmt.Errorf("--from %q: want latest, earliest, an offset or a time: %w", s, err)
	}
	return startPos{kind: "time", t: t}, nil
}

// position resolves p for one queue.
func (p startPos) position(ctx context.Context, c *client.Client, q protocol.MessageQueue) (int64, error) {
	switch p.kind {
	case "latest":
		return c.MaxOffset(ctx, q)
	case "earliest":
		return c.MinOffset(ctx, q)
	case "time":
		return c.SearchOffset(ctx, q, p.t)
	}
	lo, err := c.MinOffset(ctx, q)
	if err != nil {
		return 0, err
	}
	hi, err := c.MaxOffset(ctx, q)
	if err != nil {
		return 0, err
	}
	return min(max(p.offset, lo), hi), nil
}

func runConsume(ctx context.Context, out, errOut io.Writer, topic string, f *consumeFlags, oneQueue bool) (err error) {
	from, err := parseFrom(f.from)
	if err != nil {
		return err
	}
	if f.count < 0 || f.idle < 0 {
		return errors.New("--count and --idle must not be negative")
	}
	c, err := f.cf.client()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	r, err := f.cf.route(ctx, c, topic)
	if err != nil {
		return err
	}
	var queues []protocol.MessageQueue
	for _, q := range readQueues(r) {
		if !oneQueue || q.QueueID == int32(f.queue) {
			queues = append(queues, q)
		}
	}
	if len(queues) == 0 {
		return fmt.Errorf("topic %q has no readable queue %d", topic, f.queue)
	}
	starts := make([]int64, len(queues))
	for i, q := range queues {
		qctx, cancel := context.WithTimeout(ctx, f.cf.timeout)
		starts[i], err = from.position(qctx, c, q)
		cancel()
		if err != nil {
			return fmt.Errorf("start offset of %s: %w", queueName(q), err)
		}
	}
	fmt.Fprintf(errOut, "consuming %s from %s (%d queues)\n", topic, f.from, len(queues))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &printer{out: out, json: f.asJSON, limit: f.count, stop: cancel, last: time.Now()}
	var wg sync.WaitGroup
	errs := make([]error, len(queues))
	for i, q := range queues {
		wg.Go(func() { errs[i] = tailQueue(ctx, c, q, starts[i], f, p) })
	}
	if f.idle > 0 {
		wg.Go(func() { p.watchIdle(ctx, f.idle) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if p.err != nil {
		return p.err
	}
	fmt.Fprintf(errOut, "consumed %s\n", plural(p.n, "message"))
	return nil
}

// tailQueue pulls q from offset until ctx ends.
func tailQueue(ctx context.Context, c *client.Client, q protocol.MessageQueue, offset int64, f *consumeFlags, p *printer) error {
	failures := 0
	for ctx.Err() == nil {
		res, err := c.Pull(ctx, client.PullRequest{Queue: q, Offset: offset, MaxMsgs: 64, Suspend: time.Second, Group: f.group, Expression: f.tag})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if failures++; failures >= 5 {
				return fmt.Errorf("pull %s at %d: %w", queueName(q), offset, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(failures) * 200 * time.Millisecond):
			}
			continue
		}
		failures = 0
		switch res.Status {
		case client.PullFound:
			for i := range res.Messages {
				if !p.print(q, &res.Messages[i]) {
					return nil
				}
			}
			offset = res.NextBeginOffset
		case client.PullOffsetIllegal:
			offset = res.NextBeginOffset
		default:
			if res.NextBeginOffset > offset {
				offset = res.NextBeginOffset
			}
		}
	}
	return nil
}

// printer serialises output from the queue goroutines and counts messages.
type printer struct {
	out   io.Writer
	json  bool
	limit int64
	stop  func()
	mu    sync.Mutex
	n     int64
	err   error
	last  time.Time
}

type jsonMessage struct {
	Queue      string            `json:"queue"`
	Offset     int64             `json:"offset"`
	MsgID      string            `json:"msgId,omitempty"`
	Tags       string            `json:"tags,omitempty"`
	Keys       []string          `json:"keys,omitempty"`
	Properties map[string]string `json:"properties,omitempty"`
	BornTime   time.Time         `json:"bornTime"`
	StoreTime  time.Time         `json:"storeTime"`
	Body       string            `json:"body"`
}

// print prints m and reports whether more messages are wanted.
func (p *printer) print(q protocol.MessageQueue, m *protocol.MessageExt) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil || (p.limit > 0 && p.n >= p.limit) {
		return false
	}
	p.last = time.Now()
	body, err := m.DecompressedBody(client.DefaultMaxBodySize)
	if err != nil {
		body = m.Body
	}
	user := map[string]string{}
	protocol.RangeProperties(m.Properties, func(k, v string) bool {
		if !systemProperty(k) {
			user[k] = v
		}
		return true
	})
	var keys []string
	if k := m.Keys(); k != "" {
		keys = strings.Fields(k)
	}
	if p.json {
		b, jerr := json.Marshal(jsonMessage{Queue: queueName(q), Offset: m.QueueOffset, MsgID: m.UniqKey(), Tags: m.Tags(), Keys: keys,
			Properties: user, BornTime: time.UnixMilli(m.BornTimestamp), StoreTime: time.UnixMilli(m.StoreTimestamp), Body: string(body)})
		if jerr == nil {
			_, err = fmt.Fprintf(p.out, "%s\n", b)
		} else {
			err = jerr
		}
	} else {
		var sb strings.Builder
		fmt.Fprintf(&sb, "%s offset=%d", queueName(q), m.QueueOffset)
		if t := m.Tags(); t != "" {
			fmt.Fprintf(&sb, " tags=%s", t)
		}
		if len(keys) > 0 {
			fmt.Fprintf(&sb, " keys=%s", strings.Join(keys, ","))
		}
		for _, k := range sortedKeys(user) {
			fmt.Fprintf(&sb, " %s=%s", k, user[k])
		}
		sb.WriteString(" body=")
		sb.Write(body) // as it is: --json escapes
		sb.WriteByte('\n')
		_, err = io.WriteString(p.out, sb.String())
	}
	if err != nil {
		p.err = err
		p.stop()
		return false
	}
	p.n++
	if p.limit > 0 && p.n >= p.limit {
		p.stop()
		return false
	}
	return true
}

func (p *printer) watchIdle(ctx context.Context, idle time.Duration) {
	t := time.NewTicker(min(idle/4+time.Millisecond, 250*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		quiet := time.Since(p.last) >= idle
		p.mu.Unlock()
		if quiet {
			p.stop()
			return
		}
	}
}

// systemProperty reports RocketMQ's own message properties (not shown as
// user properties).
func systemProperty(k string) bool {
	switch k {
	case protocol.PropTags, protocol.PropKeys, protocol.PropUniqKey, "WAIT", "MIN_OFFSET", "MAX_OFFSET",
		"CLUSTER", "TRAN_MSG", "PGROUP", "REAL_TOPIC", "REAL_QID", "DELAY", "RETRY_TOPIC", "CONSUME_START_TIME",
		"MSG_REGION", "TRACE_ON", "__SHARDINGKEY", "TIMER_DELIVER_MS", "INNER_NUM", "INNER_MULTI_QUEUE_OFFSET":
		return true
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
