package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/protocol"
)

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "List and inspect a job's checkpoints; reset its source offsets",
		Long: `Works on a job's checkpoint directory (the pipeline.CheckpointDir of the job):
one Pebble store holding the latest completed checkpoint (source offsets, keyed
state, pending sink commits) and the metadata of the last few.

The job must be stopped: a running job holds the store's lock.

Examples:
  runnel checkpoint list /var/lib/jobs/orders
  runnel checkpoint inspect /var/lib/jobs/orders
  runnel checkpoint reset-offsets /var/lib/jobs/orders --topic orders --to-earliest --dry-run`,
	}
	cmd.AddCommand(newCheckpointListCmd(), newCheckpointInspectCmd(), newResetOffsetsCmd())
	return cmd
}

// openStore opens an existing checkpoint store for the CLI. It refuses
// directories that hold no store (checkpoint.Open would create one).
func openStore(dir string, fp checkpoint.Fingerprint) (*checkpoint.Store, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	found := false
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "MANIFEST-") || strings.HasPrefix(e.Name(), "marker.manifest.") {
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s holds no checkpoint store (give the job's checkpoint directory)", dir)
	}
	s, err := checkpoint.Open(dir, checkpoint.Options{Fingerprint: fp})
	if err != nil {
		if strings.Contains(err.Error(), "lock") || strings.Contains(err.Error(), "resource temporarily unavailable") {
			return nil, fmt.Errorf("open %s: %w (is the job still running? stop it first)", dir, err)
		}
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return s, nil
}

// openLatest opens dir and returns its latest checkpoint; it fails when there
// is none.
func openLatest(dir string) (*checkpoint.Store, checkpoint.Metadata, error) {
	s, err := openStore(dir, checkpoint.Fingerprint{})
	if err != nil {
		return nil, checkpoint.Metadata{}, err
	}
	md, ok := s.Latest()
	if !ok {
		_ = s.Close() // nothing written
		return nil, checkpoint.Metadata{}, fmt.Errorf("%s holds no completed checkpoint", dir)
	}
	return s, md, nil
}

func newCheckpointListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list DIR",
		Short: "List the checkpoints and savepoints a job can be restored from, newest first",
		Long: `Lists, newest first, what the checkpoint directory DIR can restore:
  latest     the job's latest completed checkpoint (what a restart resumes from)
  retained   retained copies of earlier checkpoints (pipeline.RetainCheckpoints)
  savepoint  savepoints the running job wrote (runnel savepoint create --job)
and, as "history", the metadata of the last few checkpoints that were not
retained (not restorable). Columns: id, time taken, kind, size in bytes
(retained copies share most files with the store through hard links), origin
(a periodic checkpoint, one taken as a savepoint, or restored from another
id), and the path. Restore one by id with the job's restore option
(pipeline.RestoreFrom, examples/etl -restore ID).

While the job runs its store is locked: the retained copies and savepoints
are listed, the latest checkpoint is not.

Example:
  runnel checkpoint list /var/lib/jobs/orders`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			dir := args[0]
			points, err := checkpoint.ListRestorePoints(dir)
			if err != nil {
				return err
			}
			var latest *checkpoint.Metadata
			var history []checkpoint.Metadata
			s, md, oerr := openLatest(dir)
			running := false
			switch {
			case oerr == nil:
				defer func() { err = errors.Join(err, s.Close()) }()
				latest, history = &md, s.History()
			case strings.Contains(oerr.Error(), "still running") && len(points) > 0:
				running = true
			default:
				return oerr
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "ID\tTIME\tKIND\tSIZE\tORIGIN\tPATH")
			row := func(m checkpoint.Metadata, kind string, size int64, path string) {
				sz := "-"
				if size >= 0 {
					sz = fmt.Sprint(size)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Time.Local().Format(time.DateTime), kind, sz, origin(m), path)
			}
			if latest != nil {
				size, err := storeSize(dir)
				if err != nil {
					return err
				}
				row(*latest, checkpoint.KindLatest, size, dir)
			}
			restorable := map[uint64]bool{}
			for _, p := range points {
				restorable[p.ID] = true
				row(p.Metadata, p.Kind, p.Size, p.Path)
			}
			for _, m := range history {
				if latest != nil && m.ID == latest.ID || restorable[m.ID] {
					continue
				}
				row(m, "history", -1, "(not restorable)")
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if running {
				fmt.Fprintln(cmd.OutOrStdout(), "(the job is running: its latest checkpoint is not shown)")
			}
			return nil
		},
	}
}

// origin says where a checkpoint came from.
func origin(m checkpoint.Metadata) string {
	switch {
	case m.RestoredFrom != 0:
		return fmt.Sprintf("restored from %d", m.RestoredFrom)
	case m.Savepoint:
		return "savepoint restore"
	case m.Kind == checkpoint.KindSavepoint:
		return "savepoint"
	}
	return "checkpoint"
}

// storeSize is the size of a store's own files (not its retained copies and
// savepoints).
func storeSize(dir string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // removed by Pebble meanwhile (an obsolete manifest)
		}
		if err != nil {
			return 0, err
		}
		n += fi.Size()
	}
	return n, nil
}

func newCheckpointInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect DIR",
		Short: "Show the latest checkpoint: offsets per split, state size per operator, pending sink commits",
		Long: `Shows the latest completed checkpoint of DIR:
  - its metadata and the job fingerprint (keyed operators, max parallelism);
  - the offset of every source split (RocketMQ splits "broker/queue" show the
    next queue offset to read and the stop offset; other sources' offsets are
    shown decoded when they are a plain counter, else in hex);
  - the committed state of each keyed operator: entries and bytes (keys plus
    values), counted by scanning every key group;
  - the sink transactions pre-committed but not yet known to be committed
    (they are committed again on restore).

Example:
  runnel checkpoint inspect /var/lib/jobs/orders`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			s, md, err := openLatest(args[0])
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, s.Close()) }()
			return inspect(cmd.OutOrStdout(), s, md)
		},
	}
}

func inspect(out io.Writer, s *checkpoint.Store, md checkpoint.Metadata) error {
	fmt.Fprintf(out, "checkpoint %d at %s (%d bytes, %v, format %d)\n", md.ID, md.Time.Local().Format(time.RFC3339), md.Bytes, md.Duration.Round(time.Microsecond), md.FormatVersion)
	fmt.Fprintf(out, "max parallelism %d (key groups)\n\nsplit offsets:\n", md.Fingerprint.MaxParallelism)
	offs, err := s.Offsets()
	if err != nil {
		return err
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "  SOURCE\tSPLIT\tOFFSET")
	for _, k := range sortedOffsetKeys(offs) {
		src, split, _ := strings.Cut(k, "\x00")
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", src, split, describeOffset(offs[k]))
	}
	if len(offs) == 0 {
		fmt.Fprintln(tw, "  (none)\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nkeyed state:")
	tw = newTable(out)
	fmt.Fprintln(tw, "  OPERATOR\tKIND\tENTRIES\tBYTES\tKEY GROUPS USED")
	for _, op := range md.Fingerprint.Operators {
		var entries, bytes int64
		groups := 0
		for kg := range md.Fingerprint.MaxParallelism {
			before := entries
			err := s.ScanState(op.UID, uint16(kg), nil, func(k, v []byte) bool {
				entries++
				bytes += int64(len(k) + len(v))
				return true
			})
			if err != nil {
				return fmt.Errorf("scan state of %s: %w", op.UID, err)
			}
			if entries > before {
				groups++
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\n", op.UID, op.Kind, entries, bytes, groups)
	}
	if len(md.Fingerprint.Operators) == 0 {
		fmt.Fprintln(tw, "  (no keyed operators)\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	pcs, err := s.PendingCommits()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\npending sink commits:")
	tw = newTable(out)
	fmt.Fprintln(tw, "  SINK\tSUBTASK\tCHECKPOINT\tBYTES")
	for _, pc := range pcs {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\n", pc.SinkUID, pc.Subtask, pc.CheckpointID, len(pc.Data))
	}
	if len(pcs) == 0 {
		fmt.Fprintln(tw, "  (none)\t\t\t")
	}
	return tw.Flush()
}

func sortedOffsetKeys(m map[string][]byte) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// describeOffset renders a split offset: RocketMQ source offsets decoded,
// 8-byte counters (the in-memory sources) as numbers, anything else in hex.
// describeOffset shows an offset as the status page does (rocketmq.Offset's
// String, else runtime.DescribeOffset).
func describeOffset(b []byte) string {
	if o, err := rocketmq.DecodeOffset(b); err == nil {
		return o.String()
	}
	return runtime.DescribeOffset(b)
}

type resetFlags struct {
	cf         clusterFlags
	topic      string
	sourceUID  string
	toTime     string
	toOffset   int64
	toEarliest bool
	toLatest   bool
	dryRun     bool
}

func newResetOffsetsCmd() *cobra.Command {
	var f resetFlags
	cmd := &cobra.Command{
		Use:   "reset-offsets DIR (--to-earliest | --to-latest | --to-offset N | --to-timestamp T)",
		Short: "Move a stopped job's RocketMQ source offsets, with a dry-run diff",
		Long: `Computes new offsets for the RocketMQ source splits of the job checkpointed in
DIR, prints the difference per split, and (without --dry-run) writes them as a
new checkpoint: the next id, the same job fingerprint, the same keyed state and
pending sink commits, only the offsets changed. The restarted job reads each
split from its new offset; its state is kept as it is (reset offsets re-process
or skip input, with the state those records already produced or not).

Exactly one target:
  --to-earliest      each queue's min offset (the oldest message still stored)
  --to-latest        each queue's max offset (skip everything stored so far)
  --to-offset N      offset N in every split (clamped to the queue's min/max)
  --to-timestamp T   the first message stored at or after T (RFC 3339,
                     "2006-01-02 15:04:05" local, or Unix milliseconds)

Splits are "brokerName/queueId" of --topic, which names the source's topic
(the checkpoint does not record it); --source limits the reset to one source
operator UID when the job has several. A split's stop offset (bounded jobs)
is kept. The job must be stopped.

Examples:
  runnel checkpoint reset-offsets ./ckpt --topic orders --to-earliest --dry-run
  runnel checkpoint reset-offsets ./ckpt --topic orders --to-timestamp 2024-05-01T00:00:00Z
  runnel checkpoint reset-offsets ./ckpt --topic orders --source orders-in --to-offset 0`,
		Args: exactArgs(1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := 0
			for _, set := range []bool{f.toEarliest, f.toLatest, cmd.Flags().Changed("to-offset"), f.toTime != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return fmt.Errorf("give exactly one of --to-earliest, --to-latest, --to-offset, --to-timestamp (got %d); see `%s --help`", n, cmd.CommandPath())
			}
			if cmd.Flags().Changed("to-offset") && f.toOffset < 0 {
				return fmt.Errorf("--to-offset %d must not be negative", f.toOffset)
			}
			if f.topic == "" {
				return errors.New("--topic is required: it names the topic of the source whose splits are reset")
			}
			return runReset(cmd.Context(), cmd.OutOrStdout(), args[0], &f, cmd.Flags().Changed("to-offset"))
		},
	}
	f.cf.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.topic, "topic", "", "the RocketMQ topic the source reads (required)")
	fl.StringVar(&f.sourceUID, "source", "", "reset only the splits of this source operator UID")
	fl.BoolVar(&f.toEarliest, "to-earliest", false, "reset to each queue's min offset")
	fl.BoolVar(&f.toLatest, "to-latest", false, "reset to each queue's max offset")
	fl.Int64Var(&f.toOffset, "to-offset", 0, "reset every split to this queue offset")
	fl.StringVar(&f.toTime, "to-timestamp", "", "reset to the first message stored at or after this time")
	fl.BoolVar(&f.dryRun, "dry-run", false, "only print the diff; write nothing")
	return cmd
}

type splitReset struct {
	key       string
	split     string
	old, next rocketmq.Offset
}

func runReset(ctx context.Context, out io.Writer, dir string, f *resetFlags, byOffset bool) (err error) {
	var at time.Time
	if f.toTime != "" {
		if at, err = parseTime(f.toTime); err != nil {
			return fmt.Errorf("--to-timestamp: %w", err)
		}
	}
	s, md, err := openLatest(dir)
	if err != nil {
		return err
	}
	offs, err := s.Offsets()
	cerr := s.Close()
	if err = errors.Join(err, cerr); err != nil {
		return err
	}
	var resets []splitReset
	for _, k := range sortedOffsetKeys(offs) {
		src, split, _ := strings.Cut(k, "\x00")
		if f.sourceUID != "" && src != f.sourceUID {
			continue
		}
		o, derr := rocketmq.DecodeOffset(offs[k])
		if derr != nil {
			if f.sourceUID != "" {
				return fmt.Errorf("split %s of source %s: not a RocketMQ source offset: %w", split, src, derr)
			}
			continue // another kind of source: left alone
		}
		resets = append(resets, splitReset{key: k, split: split, old: o, next: o})
	}
	if len(resets) == 0 {
		if f.sourceUID != "" {
			return fmt.Errorf("checkpoint %d of %s has no split of source %q", md.ID, dir, f.sourceUID)
		}
		return fmt.Errorf("checkpoint %d of %s has no RocketMQ source split", md.ID, dir)
	}

	c, err := f.cf.client()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	r, err := f.cf.route(ctx, c, f.topic)
	if err != nil {
		return err
	}
	routed := map[string]protocol.MessageQueue{}
	for _, q := range readQueues(r) {
		routed[queueName(q)] = q
	}
	for i := range resets {
		rs := &resets[i]
		q, ok := routed[rs.split]
		if !ok {
			return fmt.Errorf("split %s is not a readable queue of topic %s (wrong --topic?)", rs.split, f.topic)
		}
		qctx, cancel := context.WithTimeout(ctx, f.cf.timeout)
		var next int64
		switch {
		case f.toEarliest:
			next, err = c.MinOffset(qctx, q)
		case f.toLatest:
			next, err = c.MaxOffset(qctx, q)
		case byOffset:
			var lo, hi int64
			if lo, err = c.MinOffset(qctx, q); err == nil {
				if hi, err = c.MaxOffset(qctx, q); err == nil {
					next = min(max(f.toOffset, lo), hi)
				}
			}
		default:
			next, err = c.SearchOffset(qctx, q, at)
		}
		cancel()
		if err != nil {
			return fmt.Errorf("offset of %s: %w", rs.split, err)
		}
		rs.next.Next = next
	}

	fmt.Fprintf(out, "checkpoint %d of %s, topic %s:\n", md.ID, dir, f.topic)
	tw := newTable(out)
	fmt.Fprintln(tw, "  SOURCE\tSPLIT\tCURRENT\tNEW\tCHANGE")
	changed := map[string][]byte{}
	for _, rs := range resets {
		src, _, _ := strings.Cut(rs.key, "\x00")
		d := rs.next.Next - rs.old.Next
		mark := "="
		if d != 0 {
			mark = fmt.Sprintf("%+d", d)
			changed[rs.key] = rs.next.AppendTo(nil)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", src, rs.split, rs.old.Next, rs.next.Next, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case f.dryRun:
		fmt.Fprintf(out, "dry run: %d of %d splits would change; nothing written\n", len(changed), len(resets))
		return nil
	case len(changed) == 0:
		fmt.Fprintln(out, "no split changes; nothing written")
		return nil
	}
	// A new checkpoint with only the offsets: state and pending commits are
	// kept (Commit upserts offsets and leaves everything else), and the
	// fingerprint is the job's, so the job restores it as its own.
	s, err = openStore(dir, md.Fingerprint)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	if cur, ok := s.Latest(); !ok || cur.ID != md.ID {
		return fmt.Errorf("%s changed while computing the reset (latest checkpoint is no longer %d); run it again", dir, md.ID)
	}
	nm, err := s.Commit(ctx, &checkpoint.Commit{ID: md.ID + 1, Offsets: changed})
	if err != nil {
		return fmt.Errorf("write checkpoint %d: %w", md.ID+1, err)
	}
	fmt.Fprintf(out, "wrote checkpoint %d: %d splits reset; restart the job to read from the new offsets\n", nm.ID, len(changed))
	return nil
}
