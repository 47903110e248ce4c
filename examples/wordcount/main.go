// Command wordcount is runnel's word-count example: lines from a RocketMQ
// topic → words → KeyBy word → per-word counts in keyed state → stdout, with
// periodic checkpoints.
//
// By default it starts an embedded name server and broker in-process
// (package embedded), creates the topic, produces -lines lines of sample
// text and counts them, reading the topic up to the offsets it had at start
// (a bounded job), then prints "word<TAB>count" lines (in no particular
// order) and exits. With -namesrv it uses an existing cluster instead (the
// topic is created on -cluster when missing).
//
//	go run ./examples/wordcount -lines 20000
//	go run ./examples/wordcount -namesrv 127.0.0.1:9876 -lines 0 -topic my-lines
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
	"github.com/runnel-dev/runnel/examples/wordcount/wordcount"
	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "wordcount:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("wordcount", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		nsAddr   = fs.String("namesrv", "", "name server address of an existing cluster (default: start an embedded one)")
		target   = fs.String("cluster", "DefaultCluster", "cluster (or broker address) to create the topic on, with -namesrv")
		topic    = fs.String("topic", "wordcount-lines", "topic to read lines from")
		queues   = fs.Int("queues", 4, "queues of the topic when it is created")
		lines    = fs.Int("lines", 10000, "sample lines to produce before counting (0: none)")
		seed     = fs.Uint64("seed", 1, "seed of the sample text")
		dataDir  = fs.String("data", "", "directory for checkpoints and the embedded broker (default: a temporary one); a second run on it resumes the job")
		interval = fs.Duration("interval", time.Second, "checkpoint interval")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "runnel-wordcount-"); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	}
	copts := []client.Option{client.WithNameServers(*nsAddr), client.WithClientIP(netip.MustParseAddr("127.0.0.1"))}
	if *nsAddr == "" {
		cl, err := embedded.Start(ctx, embedded.WithDataDir(filepath.Join(dir, "cluster")))
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
	if err := embedded.EnsureTopic(ctx, c, *target, *topic, *queues); err != nil {
		return err
	}
	if *lines > 0 {
		p, err := client.NewProducer(c, "wordcount_producer")
		if err != nil {
			return err
		}
		err = wordcount.Produce(ctx, c, p, *topic, wordcount.SampleLines(*lines, *seed), nil)
		if cerr := p.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	src, err := rocketmq.New(c, *topic, rocketmq.WithStop(rocketmq.StopAtLatest()))
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	job := pipeline.New("wordcount", pipeline.CheckpointDir(filepath.Join(dir, "job")),
		pipeline.CheckpointInterval(*interval), pipeline.Logger(log))
	wordcount.Build(job, src, sink.NewStdout[wordcount.WordCount](stdout, nil))
	start := time.Now()
	if err := job.Run(ctx); err != nil {
		return err
	}
	st := job.Status()
	fmt.Fprintf(stderr, "wordcount: done in %v, %d checkpoints\n", time.Since(start).Round(time.Millisecond), len(st.Checkpoints))
	return nil
}
