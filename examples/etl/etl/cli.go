package etl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/state"
	"github.com/runnel-dev/runnel/transport/client"
)

// Flags is the parsed command line.
type Flags struct {
	NameServer string
	Cluster    string
	Queues     int
	Config     Config
	Verbose    bool
}

// ParseFlags parses the ETL worker's flags (shared with `runnel demo`'s
// job process).
func ParseFlags(name string, args []string, stderr io.Writer) (*Flags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &Flags{}
	fs.StringVar(&f.NameServer, "namesrv", "", "name server HOST:PORT (default: start an embedded name server and broker)")
	fs.StringVar(&f.Cluster, "cluster", "DefaultCluster", "cluster (or broker address) to create missing topics on, with -namesrv")
	fs.IntVar(&f.Queues, "queues", 4, "queues of topics this worker creates")
	fs.StringVar(&f.Config.In, "in", DefaultIn, "input topic")
	fs.StringVar(&f.Config.Out, "out", DefaultOut, "output topic")
	fs.StringVar(&f.Config.DLQ, "dlq", DefaultDLQ, "dead-letter topic")
	fs.StringVar(&f.Config.Group, "group", DefaultGroup, "job name: consumer group and producer groups")
	fs.StringVar(&f.Config.StateDir, "state", "", "checkpoint directory (default: ./etl-state)")
	fs.DurationVar(&f.Config.CheckpointInterval, "checkpoint-interval", DefaultInterval, "checkpoint interval")
	fs.BoolVar(&f.Config.SingleProcess, "single-process", false, "run the job in this process alone instead of as one worker of many")
	fs.BoolVar(&f.Config.Partitioned, "partitioned", false, "the input is partitioned by customer (as the demo produces it): count each customer in its queue's task, no repartition topic")
	fs.IntVar(&f.Config.Ranges, "ranges", 0, fmt.Sprintf("key-group ranges (tasks) of the keyed stage; every worker of the job must use the same (0: %d)", pipeline.DefaultRanges))
	fs.IntVar(&f.Config.Standbys, "standbys", 0, "warm standby copies of each task's state on other workers")
	fs.StringVar(&f.Config.StatusAddr, "status", "", "serve this worker's status (/status JSON, / page) on HOST:PORT (port 0: a free one, logged)")
	fs.StringVar(&f.Config.Restore, "restore", "", "with -single-process: restore from this retained checkpoint or savepoint id (runnel checkpoint list -state), or savepoint file, before starting (applied once)")
	fs.IntVar(&f.Config.KeepCheckpoints, "keep-checkpoints", 0, "with -single-process: keep restorable copies of this many recent checkpoints")
	fs.BoolVar(&f.Verbose, "v", false, "log at debug level to stderr")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	switch {
	case f.Config.Ranges < 0 || f.Config.Ranges > state.DefaultMaxParallelism:
		return nil, fmt.Errorf("-ranges %d: must be between 1 and %d (0: the default)", f.Config.Ranges, state.DefaultMaxParallelism)
	case f.Config.Standbys < 0:
		return nil, fmt.Errorf("-standbys %d: must not be negative", f.Config.Standbys)
	case f.Config.SingleProcess && (f.Config.Ranges != 0 || f.Config.Standbys != 0 || f.Config.Partitioned):
		return nil, errors.New("-ranges, -standbys and -partitioned configure workers: they do not apply with -single-process")
	case !f.Config.SingleProcess && (f.Config.Restore != "" || f.Config.KeepCheckpoints != 0):
		return nil, errors.New("-restore and -keep-checkpoints need -single-process (a worker's tasks restore from the job's commit chains)")
	case f.Config.KeepCheckpoints < 0:
		return nil, fmt.Errorf("-keep-checkpoints %d: must not be negative", f.Config.KeepCheckpoints)
	}
	if f.Config.StateDir == "" {
		f.Config.StateDir = "etl-state"
	}
	return f, nil
}

// StatusLogMsg is the message of the log line by which Main tells where a
// worker's status is served (attribute url).
const StatusLogMsg = "worker status"

// Main is the ETL worker's command line (examples/etl and `runnel demo`'s
// job process): it parses args, starts an embedded broker without
// -namesrv (package embedded), creates missing topics and runs the job
// until ctx ends.
func Main(ctx context.Context, name string, args []string, stderr io.Writer) (err error) {
	f, err := ParseFlags(name, args, stderr)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if f.Verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	f.Config.Logger = log
	if f.Config.StatusAddr != "" {
		// The line `runnel demo scaleout` reads a worker's status address
		// from.
		f.Config.OnStatusAddr = func(a string) { log.Info(StatusLogMsg, "url", "http://"+a+"/") }
	}
	target := f.Cluster
	copts := []client.Option{client.WithNameServers(f.NameServer), client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}
	if f.NameServer == "" {
		cl, err := embedded.Start(ctx, embedded.WithDataDir(filepath.Join(f.Config.StateDir, "cluster")))
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, cl.Close()) }()
		copts, target = cl.ClientOptions(), cl.BrokerAddr()
		log.Info("embedded name server and broker", "namesrv", cl.NameServer(), "broker", target)
	}
	c, err := client.New(copts...)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	if err := EnsureTopics(ctx, c, target, f.Queues, f.Config.In, f.Config.Out, f.Config.DLQ); err != nil {
		return err
	}
	log.Info("etl running", "in", f.Config.In, "out", f.Config.Out, "dlq", f.Config.DLQ, "group", f.Config.Group,
		"state", f.Config.StateDir, "checkpointInterval", f.Config.CheckpointInterval,
		"worker", !f.Config.SingleProcess, "partitioned", f.Config.Partitioned)
	return Run(ctx, c, f.Config)
}

// EnsureTopics creates the topics the name server does not know, with
// queues queues, on target (embedded.EnsureTopic).
func EnsureTopics(ctx context.Context, c *client.Client, target string, queues int, topics ...string) error {
	for _, t := range topics {
		if err := embedded.EnsureTopic(ctx, c, target, t, queues); err != nil {
			return fmt.Errorf("etl: %w", err)
		}
	}
	return nil
}
