// Command postgres is runnel's PostgreSQL example: orders (JSON) from a
// RocketMQ topic → decode + validate (bad records to a dead-letter table
// with their reason and raw bytes) → a PostgreSQL table, exactly once
// (sink/postgres with prepared transactions committed with each checkpoint)
// or idempotently (upserts keyed by source queue and offset). See package
// pgorders for the record contract and the tables.
//
// By default it starts an embedded name server and broker in-process
// (package embedded), creates the topic, produces -orders sample orders
// (some invalid) and writes them, reading the topic up to the offsets it
// had at start (a bounded job). With -namesrv it uses an existing cluster instead (the
// topic is created on -cluster when missing); -bounded=false runs until
// SIGINT or SIGTERM, then takes a final checkpoint and exits 0. A second run
// on the same -state resumes the job.
//
//	go run ./examples/postgres -dsn postgres://postgres@127.0.0.1:5432/test
//	go run ./examples/postgres -namesrv 127.0.0.1:9876 -orders 0 -bounded=false -state /var/lib/pg-orders
//
// The exactly-once mode needs max_prepared_transactions > 0 on the server;
// -mode idempotent does not.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/examples/postgres/pgorders"
	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
	"github.com/runnel-dev/runnel/transport/client"
)

// envDSN is the environment variable of the default -dsn.
const envDSN = "RUNNEL_TEST_POSTGRES_DSN"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "postgres:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("postgres", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg     pgorders.Config
		mode    string
		nsAddr  = fs.String("namesrv", "", "name server HOST:PORT of an existing cluster (default: start an embedded name server and broker)")
		target  = fs.String("cluster", "DefaultCluster", "cluster (or broker address) to create the topic on, with -namesrv")
		queues  = fs.Int("queues", 4, "queues of the topic when it is created")
		orders  = fs.Int("orders", 1000, "sample orders to produce before running (0: none)")
		invalid = fs.Int("invalid-every", 10, "about one sample order in this many is invalid (0: none)")
		seed    = fs.Uint64("seed", 1, "seed of the sample orders")
		verbose = fs.Bool("v", false, "log at debug level")
	)
	fs.StringVar(&cfg.DSN, "dsn", os.Getenv(envDSN), "PostgreSQL DSN (default: $"+envDSN+")")
	fs.StringVar(&mode, "mode", string(pgorders.ExactlyOnce), "delivery mode: exactly-once or idempotent")
	fs.StringVar(&cfg.Topic, "topic", pgorders.DefaultTopic, "topic to read orders from")
	fs.StringVar(&cfg.Table, "table", pgorders.DefaultTable, "orders table (created if missing; dead letters go to TABLE"+pgorders.DeadLetterSuffix+")")
	fs.StringVar(&cfg.Job, "job", pgorders.DefaultJob, "job name: consumer group, checkpoints and prepared transactions")
	fs.StringVar(&cfg.StateDir, "state", "", "checkpoint directory, also of the embedded broker (default: a temporary one); a second run on it resumes the job")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", pgorders.DefaultInterval, "checkpoint interval")
	fs.BoolVar(&cfg.Bounded, "bounded", true, "stop at the topic's offsets when the job starts (false: run until SIGINT/SIGTERM)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Mode = pgorders.Mode(mode)
	if cfg.DSN == "" {
		return fmt.Errorf("no PostgreSQL DSN: pass -dsn or set %s", envDSN)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log
	if cfg.StateDir == "" {
		if cfg.StateDir, err = os.MkdirTemp("", "runnel-postgres-"); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, os.RemoveAll(cfg.StateDir)) }()
	}
	copts := []client.Option{client.WithNameServers(*nsAddr), client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}
	if *nsAddr == "" {
		cl, err := embedded.Start(ctx, embedded.WithDataDir(filepath.Join(cfg.StateDir, "cluster")))
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, cl.Close()) }()
		copts, *target = cl.ClientOptions(), cl.BrokerAddr()
	}
	c, err := client.New(copts...)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	if err := embedded.EnsureTopic(ctx, c, *target, cfg.Topic, *queues); err != nil {
		return err
	}
	if *orders > 0 {
		p, err := client.NewProducer(c, cfg.Job+"_producer")
		if err != nil {
			return err
		}
		err = wordcount.Produce(ctx, c, p, cfg.Topic, pgorders.Bodies(pgorders.SampleOrders(*orders, *invalid, *seed)), nil)
		if cerr := p.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	start := time.Now()
	st, err := pgorders.Run(ctx, c, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "postgres: %s done in %v: %d order rows, %d dead letters into %s and %s%s; %d prepared transactions committed\n",
		cfg.Mode, time.Since(start).Round(time.Millisecond), st.Orders.Rows, st.DeadLetters.Rows, cfg.Table, cfg.Table,
		pgorders.DeadLetterSuffix, st.Orders.Committed+st.DeadLetters.Committed)
	return nil
}
