// Command etl is runnel's exactly-once ETL worker: orders (JSON) from a
// RocketMQ topic → decode + validate (bad orders to a dead-letter topic with
// their reason) → per-customer order count in keyed state and a EUR amount
// → an output topic, exactly once (see package etl for the record
// contract).
//
//	go run ./examples/etl                                  # embedded broker
//	go run ./examples/etl -namesrv 127.0.0.1:9876 -state /var/lib/etl
//
// Flags (-help lists them all): -namesrv HOST:PORT (absent: start an
// embedded name server and broker), -in TOPIC (orders), -out TOPIC
// (orders-enriched), -dlq TOPIC (orders-dlq), -group NAME (etl: the job's
// name, shared by its workers), -state DIR, -checkpoint-interval DURATION
// (1s), -ranges N and -standbys N (scale-out), -partitioned, -status
// HOST:PORT, -single-process. Every process started with the same -group
// is one worker of the job (each with its own -state); -single-process
// runs the whole job in this one. It runs until SIGINT or SIGTERM, then
// takes a final checkpoint and exits 0; a SIGKILL at any instant loses and
// duplicates nothing: the next run on the same -state resumes, and the
// other workers take its tasks meanwhile.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/runnel-dev/runnel/examples/etl/etl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := etl.Main(ctx, "etl", os.Args[1:], os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "etl:", err)
		os.Exit(1)
	}
}
