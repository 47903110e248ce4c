// Command firstjob counts clicks per user in 10-second event-time windows:
// it reads JSON click events from a RocketMQ topic, decodes and validates
// them, counts them per user in tumbling windows and prints each window's
// count. Bad events go to stderr as dead letters, late ones are printed as
// such. It checkpoints into -state (a restart resumes there) and serves its
// status page on -status.
//
//	go run ./examples/firstjob -namesrv 127.0.0.1:9876 -topic clicks
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/pipeline/window"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// Click is one event: {"user":"ann","page":"/home","ts":"2025-05-01T12:00:03Z"}.
type Click struct {
	User string    `json:"user" validate:"required"`
	Page string    `json:"page"`
	TS   time.Time `json:"ts" validate:"required"`
}

func main() {
	namesrv := flag.String("namesrv", "127.0.0.1:9876", `name server addresses, ";"-separated`)
	topic := flag.String("topic", "clicks", "topic to read")
	state := flag.String("state", "firstjob-state", "checkpoint directory")
	status := flag.String("status", "127.0.0.1:8080", "status page address")
	useTLS := flag.Bool("tls", false, "connect over TLS (the system's CAs verify the servers)")
	caFile := flag.String("tls-ca", "", "connect over TLS, verifying the servers with this CA bundle (PEM)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts, err := clientOptions(*namesrv, *useTLS, *caFile)
	if err == nil {
		err = run(ctx, *topic, opts, *state, *status)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "firstjob:", err)
		os.Exit(1)
	}
}

// run runs the job until ctx ends (Ctrl-C, SIGTERM): it then stops with a
// final checkpoint, and the next run on the same -state resumes there.
func run(ctx context.Context, topic string, opts []client.Option, state, status string) error {
	src, err := rocketmq.Dial(topic, opts) // a split per queue; offsets live in the checkpoints
	if err != nil {
		return err
	}
	defer src.Close()
	job := pipeline.New("click-counts", pipeline.CheckpointDir(state), pipeline.CheckpointInterval(5*time.Second),
		pipeline.StatusAddress(status, func(addr string) { fmt.Fprintf(os.Stderr, "status page: http://%s/ui/\n", addr) }))

	clicks := pipeline.FromBytes(job, "clicks", src.Bytes(), pipeline.JSON[Click](),
		pipeline.BoundedOutOfOrderness(2*time.Second), // clicks arrive up to 2 s out of order
		pipeline.IdleTimeout(5*time.Second),           // a quiet queue must not hold windows back
		pipeline.OnBadRecord(pipeline.DeadLetter("bad-clicks", lines(os.Stderr, func(d sink.DeadLetter) string {
			return fmt.Sprintf("bad click in %s: %s: %s", d.Split, d.Reason, d.Raw)
		})))).
		WithTimestamps(func(c Click) time.Time { return c.TS }) // event time: the click's own

	late := pipeline.NewOutputTag[Click]("late")
	counts := window.Apply(pipeline.KeyBy(clicks, func(c Click) string { return c.User }), "clicks-per-user",
		window.Tumbling(10*time.Second), window.Count[Click](), window.LateRecords(late))

	pipeline.To(counts, "print", lines(os.Stdout, func(r window.Result[string, int64]) string {
		return fmt.Sprintf("%s %s-%s %d", r.Key, r.Start.UTC().Format(time.TimeOnly), r.End.UTC().Format(time.TimeOnly), r.Value)
	}))
	pipeline.To(pipeline.SideOutput(counts, late), "print-late", lines(os.Stdout, func(c Click) string {
		return "late " + c.User + " " + c.TS.UTC().Format(time.TimeOnly)
	}))
	return job.Run(ctx)
}

// lines is a sink printing each record on w as one line, in one write.
func lines[T any](w io.Writer, format func(T) string) sink.Sink[T] {
	return sink.NewFunc(func(_ context.Context, v T) error { _, err := fmt.Fprintln(w, format(v)); return err }, nil)
}

// clientOptions returns the RocketMQ client's options: the name servers,
// ACL credentials from ROCKETMQ_ACCESS_KEY and ROCKETMQ_SECRET_KEY when
// set, and TLS when asked for.
func clientOptions(namesrv string, useTLS bool, caFile string) ([]client.Option, error) {
	opts := []client.Option{client.WithNameServers(strings.Split(namesrv, ";")...)}
	if ak := os.Getenv("ROCKETMQ_ACCESS_KEY"); ak != "" {
		opts = append(opts, client.WithCredentials(client.Credentials{AccessKey: ak, SecretKey: os.Getenv("ROCKETMQ_SECRET_KEY")}))
	}
	if !useTLS && caFile == "" {
		return opts, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		if cfg.RootCAs = x509.NewCertPool(); !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("-tls-ca " + caFile + ": no PEM certificate in it")
		}
	}
	return append(opts, client.WithTLSConfig(cfg)), nil
}
